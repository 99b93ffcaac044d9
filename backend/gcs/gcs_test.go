package gcs_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

const urlEnv = "CKPTKIT_TEST_GCS_URL"

// testURL returns the GCS URL under test, or skips (fails on CI) when the
// test servers are not running.
func testURL(t conformance.T) string {
	t.Helper()
	return storetest.TestURL(t, urlEnv)
}

var bucketOnce sync.Map // bucket -> error

// openStore opens the test URL (plus params) under a fresh random prefix
// and removes everything below it when the test ends.
func openStore(t conformance.T, kv ...string) *backend.Store {
	t.Helper()
	raw := storetest.WithParams(t, testURL(t), kv...)
	ctx := context.Background()
	root, err := backend.Open(ctx, raw)
	require.NoError(t, err)
	drv := root.Driver().(*gcs.Driver)
	errAny, ok := bucketOnce.Load(drv.Bucket())
	if !ok { // ensure the bucket once, not on every open
		errAny, _ = bucketOnce.LoadOrStore(drv.Bucket(), ensureBucket(ctx, drv))
	}
	if errAny != nil {
		require.NoError(t, errAny.(error))
	}
	return storetest.Scratch(t, root)
}

func ensureBucket(ctx context.Context, d *gcs.Driver) error {
	bkt := d.Client().Bucket(d.Bucket())
	_, err := bkt.Attrs(ctx)
	if !errors.Is(err, storage.ErrBucketNotExist) {
		return err
	}
	err = bkt.Create(ctx, "ckptkit-test", nil)
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == http.StatusConflict {
		return nil
	}
	return err
}

func TestRoundTrip(t *testing.T) {
	storetest.RoundTrip(t, openStore(t))
}

func TestWrongCRC32CRejected(t *testing.T) {
	storetest.WrongCRC32CRejected(t, openStore(t))
}

func TestRangedReads(t *testing.T) {
	storetest.RangedReads(t, openStore(t))
}

func TestNotFound(t *testing.T) {
	storetest.NotFound(t, openStore(t))
}

func TestDeleteMissingOK(t *testing.T) {
	storetest.DeleteMissingOK(t, openStore(t))
}

func TestZeroLength(t *testing.T) {
	storetest.ZeroLength(t, openStore(t))
}

func TestFailingSourceNeverPublishes(t *testing.T) {
	storetest.FailingSourceNeverPublishes(t, openStore(t, "chunk_size", "256KiB"), []storetest.UploadCase{
		{Name: "single request", Size: 200 << 10, At: 100 << 10},
		{Name: "resumable", Size: 3 << 20, At: 1 << 20},
		{Name: "resumable last chunk", Size: 3 << 20, At: 3<<20 - 100},
	})
}

func TestCreateIfAbsent(t *testing.T) {
	storetest.CreateIfAbsent(t, openStore(t))
}

func TestResumableSmallChunks(t *testing.T) {
	st := openStore(t, "chunk_size", "256KiB")
	ctx := context.Background()
	caps := st.Capabilities()
	assert.True(t, caps.Multipart)
	assert.Equal(t, int64(256<<10), caps.PartSize)

	const size = 3<<20 + 777 // twelve full chunks and a short one
	crc, _, err := storetest.CRCOf(storetest.NewGen(3, size))
	require.NoError(t, err)
	require.NoError(t, storetest.PutGen(ctx, st, "rs.bin", 3, size, backend.PutOptions{CRC32C: &crc}))
	storetest.CheckGen(t, st, "rs.bin", 3, size)
	attrs, err := st.Stat(ctx, "rs.bin")
	require.NoError(t, err)
	if assert.NotNil(t, attrs.CRC32C) {
		assert.Equal(t, crc, *attrs.CRC32C)
	}
	dst := make([]byte, 64)
	require.NoError(t, st.ReadRange(ctx, "rs.bin", 256<<10-32, dst))
	assert.Equal(t, storetest.GenBytes(3, 256<<10-32, 64), dst)
	// Without a declared CRC the client computes one while streaming.
	require.NoError(t, storetest.PutGen(ctx, st, "rs2.bin", 4, size, backend.PutOptions{}))
	storetest.CheckGen(t, st, "rs2.bin", 4, size)
}

func TestResumableLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB upload skipped in -short mode")
	}
	// Five resumable chunks: fake-gcs-server copies the object so far on
	// every chunk, so 16 MiB chunks take twice as long here, to no benefit.
	st := openStore(t, "chunk_size", "64MiB")
	ctx := context.Background()
	const size = 256<<20 + 12345
	start := time.Now()
	require.NoError(t, storetest.PutGen(ctx, st, "big.bin", 11, size, backend.PutOptions{}))
	t.Logf("uploaded %d MiB in %v", size>>20, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	storetest.CheckGen(t, st, "big.bin", 11, size)
	t.Logf("read back and checked in %v", time.Since(start).Round(time.Millisecond))
}

// TestResumableCreateIfAbsentRace: another writer creates the key while our
// resumable upload is in flight; our upload must lose with ErrAlreadyExists
// and leave the other writer's object intact.
func TestResumableCreateIfAbsentRace(t *testing.T) {
	storetest.CreateIfAbsentRace(t, openStore(t, "chunk_size", "256KiB"), 3<<20, 1<<20)
}

func TestCancelMidUploadPublishesNothing(t *testing.T) {
	storetest.CancelMidUploadPublishesNothing(t, openStore(t, "chunk_size", "256KiB"), []storetest.UploadCase{
		{Name: "single request", Size: 200 << 10, At: 100 << 10},
		{Name: "resumable", Size: 3 << 20, At: 1 << 20},
	})
}

func TestSortedListing(t *testing.T) {
	keys := []string{"b", "a/c", "a-b", "a/b/d", "a0", "A", "a/b", "z/y/x", "a.b", "\u00e9t\u00e9", "a/b-c"}
	storetest.SortedListing(t, openStore(t), keys, []string{"a/b", "a/b-c", "a/b/d", "a/c"})
}

func TestCredentialsNeverInErrors(t *testing.T) {
	raw := testURL(t)
	ctx := context.Background()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword("someone", "url-secret-value")
	_, err = backend.Open(ctx, u.String())
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "url-secret-value")

	st := openStore(t)
	_, err = st.Stat(ctx, "missing")
	require.Error(t, err)
	assert.NotContains(t, strings.ToLower(err.Error()), "bearer")
}

func TestInvalidKeysRejected(t *testing.T) {
	storetest.InvalidKeysRejected(t, openStore(t))
}

func TestURLParameters(t *testing.T) {
	raw := testURL(t)
	ctx := context.Background()
	st, err := backend.Open(ctx, storetest.WithParams(t, raw, "chunk_size", "300000"))
	require.NoError(t, err)
	defer st.Close()
	assert.Equal(t, 512<<10, st.Driver().(*gcs.Driver).ChunkSize(), "rounded up to 256 KiB")
	_, err = backend.Open(ctx, storetest.WithParams(t, raw, "chunk_sise", "1"))
	assert.ErrorContains(t, err, "chunk_sise")
	_, err = backend.Open(ctx, storetest.WithParams(t, raw, "chunk_size", "lots"))
	assert.Error(t, err)
}

func TestErrorCode(t *testing.T) {
	d, err := gcs.New(context.Background(), "bkt", gcs.Options{ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
	require.NoError(t, err)
	defer d.Close()
	for _, tc := range []struct {
		err  error
		want backend.Code
	}{
		{storage.ErrObjectNotExist, backend.CodeNotFound},
		{fmt.Errorf("x: %w", storage.ErrBucketNotExist), backend.CodeNotFound},
		{&googleapi.Error{Code: 404}, backend.CodeNotFound},
		{&googleapi.Error{Code: 412}, backend.CodeAlreadyExists},
		{fmt.Errorf("w: %w", &googleapi.Error{Code: 403}), backend.CodePermission},
		{&googleapi.Error{Code: 429}, backend.CodeTransient},
		{&googleapi.Error{Code: 503}, backend.CodeTransient},
		{&googleapi.Error{Code: 400}, backend.CodeUnknown},
		{fmt.Errorf("x: %w", context.Canceled), backend.CodeCanceled},
	} {
		assert.Equal(t, tc.want, d.ErrorCode(tc.err), "%v", tc.err)
	}
}

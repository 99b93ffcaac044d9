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

	"cloud.google.com/go/storage"
	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
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

func TestURLParameters(t *testing.T) {
	raw := testURL(t)
	ctx := context.Background()
	st, err := backend.Open(ctx, storetest.WithParams(t, raw, "chunk_size", "300000"))
	require.NoError(t, err)
	defer st.Close()
	assert.Equal(t, 512<<10, st.Driver().(*gcs.Driver).ChunkSize(), "rounded up to 256 KiB")
	caps := st.Capabilities()
	assert.True(t, caps.Multipart, "resumable uploads are the multipart path the conformance cases size their bodies for")
	assert.Equal(t, int64(512<<10), caps.PartSize)
	assert.True(t, caps.ServerCRC32C)
	assert.True(t, caps.CreateIfAbsent)
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

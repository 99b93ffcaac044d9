package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const urlEnv = "CKPTKIT_TEST_S3_URL"

// testURL returns the S3 URL under test, or skips (fails on CI) when the
// test servers are not running.
func testURL(t conformance.T) string {
	t.Helper()
	u := os.Getenv(urlEnv)
	if u == "" {
		msg := urlEnv + ` is unset; start the test servers with: eval "$(scripts/test-servers.sh start)"`
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s", msg)
		}
		t.Skip(msg)
	}
	return u
}

// withParams adds query parameters to the test URL.
func withParams(t conformance.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

var bucketOnce sync.Map // bucket -> error

// openStore opens the test URL (plus params) under a fresh random prefix
// and removes everything below it when the test ends.
func openStore(t conformance.T, kv ...string) *backend.Store {
	t.Helper()
	raw := withParams(t, testURL(t), kv...)
	ctx := context.Background()
	root, err := backend.Open(ctx, raw)
	require.NoError(t, err)
	drv := root.Driver().(*s3.Driver)
	errAny, _ := bucketOnce.LoadOrStore(drv.Bucket(), ensureBucket(ctx, drv))
	if errAny != nil {
		require.NoError(t, errAny.(error))
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	st, err := root.Sub("t-" + hex.EncodeToString(b[:]))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var keys []string
		_ = st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil })
		for _, k := range keys {
			assert.NoError(t, st.Delete(ctx, k))
		}
		_ = root.Close()
	})
	return st
}

func ensureBucket(ctx context.Context, d *s3.Driver) error {
	ok, err := d.Client().BucketExists(ctx, d.Bucket())
	if err != nil || ok {
		return err
	}
	if err := d.Client().MakeBucket(ctx, d.Bucket(), minio.MakeBucketOptions{}); err != nil {
		if minio.ToErrorResponse(err).Code != minio.BucketAlreadyOwnedByYou {
			return err
		}
	}
	return nil
}

// gen is a cheap deterministic byte stream: the byte at position p is a
// function of (seed, p) alone, so ranges can be checked without storing data.
type gen struct {
	seed uint64
	pos  int64
	size int64
}

func newGen(seed uint64, size int64) *gen { return &gen{seed: seed, size: size} }

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (g *gen) Read(p []byte) (int, error) {
	if g.pos >= g.size {
		return 0, io.EOF
	}
	if rem := g.size - g.pos; int64(len(p)) > rem {
		p = p[:rem]
	}
	n := 0
	for n < len(p) {
		word := uint64(g.pos+int64(n)) / 8
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(g.seed^word))
		off := int(uint64(g.pos+int64(n)) % 8)
		n += copy(p[n:], w[off:])
	}
	g.pos += int64(n)
	return n, nil
}

// genBytes returns bytes [off, off+n) of the stream of seed.
func genBytes(seed uint64, off, n int64) []byte {
	g := &gen{seed: seed, pos: off, size: off + n}
	b, _ := io.ReadAll(g)
	return b
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crcOf(r io.Reader) (uint32, int64, error) {
	h := crc32.New(castagnoli)
	n, err := io.Copy(h, r)
	return h.Sum32(), n, err
}

// onlyReader hides io.Seeker so the Store cannot retry.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// hookReader calls hook once, when at least after bytes have been read.
type hookReader struct {
	r     io.Reader
	after int64
	read  int64
	hook  func() error
	done  bool
}

func (h *hookReader) Read(p []byte) (int, error) {
	if !h.done && h.read >= h.after {
		h.done = true
		if err := h.hook(); err != nil {
			return 0, err
		}
	}
	n, err := h.r.Read(p)
	h.read += int64(n)
	return n, err
}

// assertContent checks key holds want without dumping large bodies.
func assertContent(t *testing.T, st *backend.Store, key string, want []byte) {
	t.Helper()
	got := readAll(t, st, key)
	assert.True(t, bytes.Equal(want, got), "%s: got %d bytes, want %d bytes %q", key, len(got), len(want), want)
}

func readAll(t *testing.T, st *backend.Store, key string) []byte {
	t.Helper()
	b, err := st.ReadAll(context.Background(), key, 0)
	require.NoError(t, err)
	return b
}

func TestRoundTrip(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	data := []byte("hello, checkpoint")
	crc := crc32.Checksum(data, castagnoli)
	require.NoError(t, st.PutBytes(ctx, "a/b.bin", data, backend.PutOptions{CRC32C: &crc}))
	assert.Equal(t, data, readAll(t, st, "a/b.bin"))
	attrs, err := st.Stat(ctx, "a/b.bin")
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), attrs.Size)
	assert.WithinDuration(t, time.Now(), attrs.ModTime, 5*time.Minute)
	if assert.NotNil(t, attrs.CRC32C, "server keeps the CRC32C") {
		assert.Equal(t, crc, *attrs.CRC32C)
	}

	// Without a declared CRC the driver streams one as a trailer.
	require.NoError(t, st.Put(ctx, "c.bin", int64(len(data)), onlyReader{bytes.NewReader(data)}, backend.PutOptions{}))
	assert.Equal(t, data, readAll(t, st, "c.bin"))

	// Overwrite replaces.
	require.NoError(t, st.PutBytes(ctx, "a/b.bin", []byte("v2"), backend.PutOptions{}))
	assert.Equal(t, []byte("v2"), readAll(t, st, "a/b.bin"))
}

func TestWrongCRC32CRejected(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	bad := uint32(12345)
	err := st.PutBytes(ctx, "bad.bin", []byte("payload"), backend.PutOptions{CRC32C: &bad})
	require.Error(t, err)
	_, err = st.Stat(ctx, "bad.bin")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestRangedReads(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	data := genBytes(7, 0, 1000)
	require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}))
	for _, tc := range []struct {
		name           string
		offset, length int64
		want           []byte
	}{
		{"whole", 0, -1, data},
		{"prefix", 0, 10, data[:10]},
		{"middle", 100, 50, data[100:150]},
		{"to end", 990, -1, data[990:]},
		{"clamped at end", 995, 100, data[995:]},
		{"last byte", 999, 1, data[999:]},
		{"at end", 1000, -1, nil},
		{"at end with length", 1000, 5, nil},
		{"past end", 5000, 10, nil},
		{"past end to end", 5000, -1, nil},
		{"zero length", 10, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := st.NewRangeReader(ctx, "obj", tc.offset, tc.length)
			require.NoError(t, err)
			got, err := io.ReadAll(rc)
			require.NoError(t, err)
			require.NoError(t, rc.Close())
			assert.Equal(t, len(tc.want), len(got))
			assert.True(t, bytes.Equal(tc.want, got))
		})
	}
	dst := make([]byte, 20)
	require.NoError(t, st.ReadRange(ctx, "obj", 500, dst))
	assert.Equal(t, data[500:520], dst)
	err := st.ReadRange(ctx, "obj", 990, dst)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestNotFound(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	_, err := st.Stat(ctx, "missing")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 0, -1)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 10, 5)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 0, 0)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.ReadAll(ctx, "dir/missing", 0)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	ok, err := st.Exists(ctx, "missing")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.NotErrorIs(t, err, backend.ErrTransient)
}

func TestDeleteMissingOK(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	require.NoError(t, st.Delete(ctx, "never-written"))
	require.NoError(t, st.PutBytes(ctx, "x", []byte("x"), backend.PutOptions{}))
	require.NoError(t, st.Delete(ctx, "x"))
	require.NoError(t, st.Delete(ctx, "x"))
	_, err := st.Stat(ctx, "x")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestZeroLength(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "empty", nil, backend.PutOptions{}))
	attrs, err := st.Stat(ctx, "empty")
	require.NoError(t, err)
	assert.Zero(t, attrs.Size)
	assert.Empty(t, readAll(t, st, "empty"))
	rc, err := st.NewRangeReader(ctx, "empty", 0, 10)
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Empty(t, b)
	require.NoError(t, rc.Close())
	// Create-if-absent of an empty object.
	require.NoError(t, st.PutBytes(ctx, "empty2", nil, backend.PutOptions{IfNotExists: true}))
	err = st.PutBytes(ctx, "empty2", nil, backend.PutOptions{IfNotExists: true})
	assert.ErrorIs(t, err, backend.ErrAlreadyExists)
}

// failingSource fails after n good bytes.
type failingSource struct {
	r io.Reader
	n int64
}

var errSource = errors.New("source exploded")

func (f *failingSource) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errSource
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

func TestFailingSourceNeverPublishes(t *testing.T) {
	st := openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
	ctx := context.Background()
	old := []byte("old contents")
	for _, tc := range []struct {
		name       string
		size, fail int64
	}{
		{"single put", 1 << 20, 300 << 10},
		{"multipart", 12 << 20, 7 << 20},
		{"multipart last part", 12 << 20, 11 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.ReplaceAll(tc.name, " ", "-")
			require.NoError(t, st.PutBytes(ctx, key, old, backend.PutOptions{}))
			err := st.Put(ctx, key, tc.size, &failingSource{r: newGen(1, tc.size), n: tc.fail}, backend.PutOptions{})
			require.ErrorIs(t, err, errSource)
			assertContent(t, st, key, old)

			// A source that is short without an error is a size mismatch.
			err = st.Put(ctx, key, tc.size, onlyReader{newGen(1, tc.fail)}, backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch)
			assertContent(t, st, key, old)

			// And so is one that holds more than declared.
			err = st.Put(ctx, key, tc.size, onlyReader{newGen(1, tc.size+1)}, backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch)
			assertContent(t, st, key, old)
		})
	}
	assertNoIncompleteUploads(t, st)
}

func TestCreateIfAbsent(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	require.True(t, st.Capabilities().CreateIfAbsent)
	require.NoError(t, st.PutBytes(ctx, "k", []byte("first"), backend.PutOptions{IfNotExists: true}))
	err := st.PutBytes(ctx, "k", []byte("second"), backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	assert.NotErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, []byte("first"), readAll(t, st, "k"))
}

// putGen writes size generated bytes of seed to key, non-seekable.
func putGen(ctx context.Context, st *backend.Store, key string, seed uint64, size int64, opts backend.PutOptions) error {
	return st.Put(ctx, key, size, onlyReader{newGen(seed, size)}, opts)
}

// checkGen verifies key holds size generated bytes of seed, streaming.
func checkGen(t *testing.T, st *backend.Store, key string, seed uint64, size int64) {
	t.Helper()
	ctx := context.Background()
	attrs, err := st.Stat(ctx, key)
	require.NoError(t, err)
	require.Equal(t, size, attrs.Size)
	want, _, err := crcOf(newGen(seed, size))
	require.NoError(t, err)
	rc, err := st.NewRangeReader(ctx, key, 0, -1)
	require.NoError(t, err)
	defer rc.Close()
	got, n, err := crcOf(rc)
	require.NoError(t, err)
	require.Equal(t, size, n)
	require.Equal(t, want, got, "content CRC32C")
}

func TestMultipartSmallParts(t *testing.T) {
	st := openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "3")
	ctx := context.Background()
	caps := st.Capabilities()
	assert.True(t, caps.Multipart)
	assert.Equal(t, int64(5<<20), caps.PartSize)
	assert.Equal(t, 3, caps.Concurrency)

	const size = 12 << 20 // three parts, the last one short
	crc, _, err := crcOf(newGen(3, size))
	require.NoError(t, err)
	require.NoError(t, putGen(ctx, st, "mp.bin", 3, size, backend.PutOptions{CRC32C: &crc}))
	checkGen(t, st, "mp.bin", 3, size)
	attrs, err := st.Stat(ctx, "mp.bin")
	require.NoError(t, err)
	if assert.NotNil(t, attrs.CRC32C, "full-object CRC32C of a multipart object") {
		assert.Equal(t, crc, *attrs.CRC32C)
	}

	// A range across the first part boundary.
	dst := make([]byte, 64)
	require.NoError(t, st.ReadRange(ctx, "mp.bin", 5<<20-32, dst))
	assert.Equal(t, genBytes(3, 5<<20-32, 64), dst)

	// A declared CRC that does not match the body fails before completing.
	bad := crc ^ 1
	err = putGen(ctx, st, "mp-bad.bin", 3, size, backend.PutOptions{CRC32C: &bad})
	require.Error(t, err)
	_, err = st.Stat(ctx, "mp-bad.bin")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	assertNoIncompleteUploads(t, st)
}

func TestMultipartLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB upload skipped in -short mode")
	}
	st := openStore(t, "concurrency", "4")
	ctx := context.Background()
	const size = 256<<20 + 12345
	start := time.Now()
	require.NoError(t, putGen(ctx, st, "big.bin", 11, size, backend.PutOptions{}))
	t.Logf("uploaded %d MiB in %v", size>>20, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	checkGen(t, st, "big.bin", 11, size)
	t.Logf("read back and checked in %v", time.Since(start).Round(time.Millisecond))
}

// TestMultipartCreateIfAbsentRace is the test for the minio-go behaviour
// where PutObject drops If-None-Match on CompleteMultipartUpload: another
// writer creates the key while our parts are uploading; our completion must
// lose with ErrAlreadyExists and leave the other writer's object intact.
func TestMultipartCreateIfAbsentRace(t *testing.T) {
	st := openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
	ctx := context.Background()
	const size = 12 << 20
	winner := []byte("the other writer got here first")
	src := &hookReader{r: newGen(5, size), after: 6 << 20, hook: func() error {
		return st.PutBytes(ctx, "race.bin", winner, backend.PutOptions{IfNotExists: true})
	}}
	err := st.Put(ctx, "race.bin", size, onlyReader{src}, backend.PutOptions{IfNotExists: true})
	require.True(t, src.done, "the competing write ran mid-upload")
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	assertContent(t, st, "race.bin", winner)

	// Existing before the upload starts: refused too, without uploading.
	err = putGen(ctx, st, "race.bin", 5, size, backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	assertContent(t, st, "race.bin", winner)

	// And a free key is created.
	require.NoError(t, putGen(ctx, st, "free.bin", 5, size, backend.PutOptions{IfNotExists: true}))
	checkGen(t, st, "free.bin", 5, size)
	assertNoIncompleteUploads(t, st)
}

func TestCancelMidUploadPublishesNothing(t *testing.T) {
	st := openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "2")
	for _, tc := range []struct {
		name        string
		size, after int64
	}{
		{"single put", 4 << 20, 1 << 20},
		{"multipart", 24 << 20, 11 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			key := strings.ReplaceAll(tc.name, " ", "-")
			src := &hookReader{r: newGen(9, tc.size), after: tc.after, hook: func() error { cancel(); return nil }}
			start := time.Now()
			err := st.Put(ctx, key, tc.size, onlyReader{src}, backend.PutOptions{})
			require.Error(t, err)
			assert.ErrorIs(t, err, context.Canceled)
			assert.Less(t, time.Since(start), 20*time.Second)
			_, err = st.Stat(context.Background(), key)
			assert.ErrorIs(t, err, backend.ErrNotFound)
		})
	}
	assertNoIncompleteUploads(t, st)
}

// assertNoIncompleteUploads checks that every multipart upload under the
// store's prefix was completed or aborted.
func assertNoIncompleteUploads(t *testing.T, st *backend.Store) {
	t.Helper()
	d := st.Driver().(*s3.Driver)
	d.WaitAborts()
	var left []string
	for u := range d.Client().ListIncompleteUploads(context.Background(), d.Bucket(), st.Prefix(), true) {
		if u.Err != nil {
			t.Logf("listing incomplete uploads: %v", u.Err)
			return
		}
		left = append(left, u.Key)
	}
	assert.Empty(t, left, "multipart uploads left behind")
}

func TestSortedListing(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	// No key is also a "directory" of another: versitygw's posix backend
	// cannot store both a/b and a/b/d.
	keys := []string{"b", "a/c", "a-b", "a/b/d", "a0", "A", "a/b/e", "z/y/x", "a.b", "\u00e9t\u00e9", "a/b-c"}
	for i, k := range keys {
		require.NoError(t, st.PutBytes(ctx, k, []byte(k), backend.PutOptions{}), "key %d", i)
	}
	var got []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error {
		got = append(got, o.Key)
		assert.Equal(t, int64(len(o.Key)), o.Size)
		return nil
	}))
	want := append([]string(nil), keys...)
	sort.Strings(want)
	assert.Equal(t, want, got)

	got = nil
	require.NoError(t, st.List(ctx, "a/", func(o backend.ObjectInfo) error { got = append(got, o.Key); return nil }))
	assert.Equal(t, []string{"a/b-c", "a/b/d", "a/b/e", "a/c"}, got)

	// fn's error stops the listing and comes back unchanged.
	stop := errors.New("stop")
	n := 0
	err := st.List(ctx, "", func(backend.ObjectInfo) error { n++; return stop })
	assert.ErrorIs(t, err, stop)
	assert.Equal(t, 1, n)
}

func TestCredentialsNeverInErrors(t *testing.T) {
	raw := testURL(t)
	st := openStore(t)
	ctx := context.Background()
	secret := os.Getenv("AWS_SECRET_ACCESS_KEY")
	require.NotEmpty(t, secret)
	_, err := st.Stat(ctx, "missing")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), secret)

	// Wrong secret: a permission error that names neither secret.
	bogus := "bogus-secret-" + fmt.Sprint(time.Now().UnixNano())
	t.Setenv("AWS_SECRET_ACCESS_KEY", bogus)
	bad, err := backend.Open(ctx, raw)
	require.NoError(t, err)
	defer bad.Close()
	_, err = bad.Stat(ctx, "anything")
	require.ErrorIs(t, err, backend.ErrPermission)
	assert.NotContains(t, err.Error(), bogus)
	assert.NotContains(t, err.Error(), secret)
	err = bad.PutBytes(ctx, "anything", []byte("x"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrPermission)
	assert.NotContains(t, err.Error(), bogus)

	// Credentials in the URL are refused without being echoed.
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword("AKIDEXAMPLE", "url-secret-value")
	_, err = backend.Open(ctx, u.String())
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "url-secret-value")
}

func TestInvalidKeysRejected(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	for _, k := range []string{"../escape", "/abs", "a/../b", "nul\x00"} {
		err := st.PutBytes(ctx, k, []byte("x"), backend.PutOptions{})
		assert.ErrorIs(t, err, backend.ErrInvalidKey, k)
	}
}

func TestParseQuery(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "http://example.test:9000")
	t.Setenv("AWS_REGION", "eu-west-1")
	o, err := s3.ParseQuery(url.Values{"part_size": {"8MiB"}, "concurrency": {"2"}, "multipart_threshold": {"1048576"}, "path_style": {"true"}})
	require.NoError(t, err)
	assert.Equal(t, "example.test:9000", o.Endpoint)
	assert.True(t, o.Insecure)
	assert.True(t, o.PathStyle)
	assert.Equal(t, "eu-west-1", o.Region)
	assert.Equal(t, int64(8<<20), o.PartSize)
	assert.Equal(t, 2, o.Concurrency)
	assert.Equal(t, int64(1<<20), o.MultipartThreshold)

	o, err = s3.ParseQuery(url.Values{"endpoint": {"h:1"}, "secure": {"false"}, "region": {"r"}})
	require.NoError(t, err)
	assert.Equal(t, "h:1", o.Endpoint)
	assert.True(t, o.Insecure)
	assert.Equal(t, "r", o.Region)

	_, err = s3.ParseQuery(url.Values{"part_sise": {"1"}})
	assert.ErrorContains(t, err, "part_sise")
	_, err = s3.ParseQuery(url.Values{"part_size": {"lots"}})
	assert.Error(t, err)
	_, err = s3.New("b", s3.Options{PartSize: 1 << 20})
	assert.Error(t, err, "parts below the S3 minimum are refused")
}

func TestErrorCode(t *testing.T) {
	d, err := s3.New("bkt", s3.Options{Endpoint: "127.0.0.1:1", Insecure: true, Region: "us-east-1",
		Credentials: credentials.NewStaticV4("AKID", "not-a-secret", "")})
	require.NoError(t, err)
	for _, tc := range []struct {
		err  error
		want backend.Code
	}{
		{minio.ErrorResponse{Code: minio.NoSuchKey, StatusCode: 404}, backend.CodeNotFound},
		{minio.ErrorResponse{StatusCode: 404}, backend.CodeNotFound},
		{minio.ErrorResponse{Code: minio.PreconditionFailed, StatusCode: 412}, backend.CodeAlreadyExists},
		{minio.ErrorResponse{Code: minio.AccessDenied, StatusCode: 403}, backend.CodePermission},
		{minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}, backend.CodeTransient},
		{minio.ErrorResponse{Code: "Whatever", StatusCode: 502}, backend.CodeTransient},
		{fmt.Errorf("wrapped: %w", minio.ErrorResponse{Code: minio.NoSuchBucket}), backend.CodeNotFound},
		{fmt.Errorf("x: %w", context.Canceled), backend.CodeCanceled},
		{minio.ErrorResponse{Code: minio.InvalidArgument, StatusCode: 400}, backend.CodeUnknown},
	} {
		assert.Equal(t, tc.want, d.ErrorCode(tc.err), "%v", tc.err)
	}
	// A refused connection is transient.
	_, err = d.Stat(context.Background(), "k")
	require.Error(t, err)
	assert.Equal(t, backend.CodeTransient, d.ErrorCode(err), "%v", err)
}

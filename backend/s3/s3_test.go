package s3_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
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
	return storetest.TestURL(t, urlEnv)
}

// withParams adds query parameters to the test URL.
func withParams(t conformance.T, raw string, kv ...string) string {
	t.Helper()
	return storetest.WithParams(t, raw, kv...)
}

var buckets sync.Map // endpoint/bucket -> error of ensureBucket

// openStore opens the test URL (plus params) under a fresh random prefix
// and removes everything below it when the test ends.
func openStore(t conformance.T, kv ...string) *backend.Store {
	t.Helper()
	return openStoreAt(t, testURL(t), kv...)
}

// openStoreAt is openStore for an explicit server URL (the SeaweedFS
// harness uses it): the bucket is created once per endpoint.
func openStoreAt(t conformance.T, raw string, kv ...string) *backend.Store {
	t.Helper()
	ctx := context.Background()
	root, err := backend.Open(ctx, withParams(t, raw, kv...))
	require.NoError(t, err)
	drv := root.Driver().(*s3.Driver)
	id := drv.Options().Endpoint + "/" + drv.Bucket()
	errAny, ok := buckets.Load(id)
	if !ok {
		errAny, _ = buckets.LoadOrStore(id, ensureBucket(ctx, drv))
	}
	if errAny != nil {
		require.NoError(t, errAny.(error))
	}
	return storetest.Scratch(t, root)
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

// TestSmallPartsFromURL checks the URL's part size and concurrency reach
// the driver's declared capabilities, from which the conformance cases size
// their multipart bodies.
func TestSmallPartsFromURL(t *testing.T) {
	caps := openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "3").Capabilities()
	assert.True(t, caps.Multipart)
	assert.Equal(t, int64(5<<20), caps.PartSize)
	assert.Equal(t, 3, caps.Concurrency)
	assert.True(t, caps.ServerCRC32C)
	assert.True(t, caps.CreateIfAbsent)
}

// noIncompleteUploads fails when a multipart upload below st's prefix was
// neither completed nor aborted (the conformance Leftovers check).
func noIncompleteUploads(t conformance.T, st *backend.Store) {
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
	require.Empty(t, left, "multipart uploads left behind")
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

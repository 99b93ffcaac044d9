package backend_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
)

func TestUnknownScheme(t *testing.T) {
	_, err := backend.Open(context.Background(), "nope://bucket/x")
	require.ErrorIs(t, err, backend.ErrUnknownScheme)
	for _, s := range []string{"file", "mem"} {
		assert.Contains(t, backend.Schemes(), s)
		assert.Contains(t, err.Error(), s)
	}
}

func TestCredentialsNeverInErrors(t *testing.T) {
	ctx := context.Background()
	for _, url := range []string{
		"s3://AKIDUSER:supersecret@bucket/x",
		"nope://user:supersecret@host/x?token=supersecret",
		"mem://user:supersecret@name/x",
		"s3://bucket/x?secret_key=supersecret",
		"s3://user:supersecret@bucket/%zz",
	} {
		s, err := backend.Open(ctx, url)
		if err != nil {
			assert.NotContains(t, err.Error(), "supersecret", url)
			continue
		}
		// A backend that opened must still keep the secret out of messages.
		assert.NotContains(t, s.String(), "supersecret")
		_, err = s.Stat(ctx, "absent")
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "supersecret")
		_ = s.Close()
	}
}

// Regression: a mem:// store without a bucket name printed its URLs as
// "mem:/x/k", which Open would then read as a local path.
func TestBucketlessURLKeepsItsSlashes(t *testing.T) {
	st, err := backend.Open(context.Background(), "mem://")
	require.NoError(t, err)
	sub, err := st.Sub("x")
	require.NoError(t, err)
	require.Equal(t, "mem:///x/k", sub.URL("k"))
}

// bodyIgnoringDriver publishes empty objects without reading their body, as
// the S3 driver legitimately does.
type bodyIgnoringDriver struct{ backend.Driver }

func (d bodyIgnoringDriver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if size == 0 {
		return d.Driver.Put(ctx, key, 0, strings.NewReader(""), opts)
	}
	return d.Driver.Put(ctx, key, size, r, opts)
}

// Regression (found by the conformance suite on S3): declaring 0 bytes and
// delivering 3 published an empty object when the driver never read the body.
func TestDeclaredEmptyButLongSourceIsRefused(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://")
	require.NoError(t, err)
	st = st.WithDriver(bodyIgnoringDriver{st.Driver()})
	err = st.Put(ctx, "k", 0, strings.NewReader("abc"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrSizeMismatch)
	ok, err := st.Exists(ctx, "k")
	require.NoError(t, err)
	require.False(t, ok)
}

// ctxDeafDriver ignores the caller's context, like an HTTP client that
// only notices a cancellation when the response arrives.
type ctxDeafDriver struct{ backend.Driver }

func (d ctxDeafDriver) Put(_ context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	return d.Driver.Put(context.Background(), key, size, r, opts)
}

// cancelHalfway cancels its context after delivering half of data.
type cancelHalfway struct {
	data   []byte
	pos    int
	cancel context.CancelFunc
}

func (c *cancelHalfway) Read(p []byte) (int, error) {
	if c.pos >= len(c.data) {
		return 0, io.EOF
	}
	if c.pos >= len(c.data)/2 {
		c.cancel()
	}
	n := copy(p[:min(len(p), 1024)], c.data[c.pos:])
	c.pos += n
	return n, nil
}

// Regression (found by the conformance suite on S3): a write cancelled
// midway was published when the driver sent the rest of the body anyway.
func TestCancelledMidBodyNeverPublishes(t *testing.T) {
	st, err := backend.Open(context.Background(), "mem://")
	require.NoError(t, err)
	st = st.WithDriver(ctxDeafDriver{st.Driver()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := bytes.Repeat([]byte("x"), 64<<10)
	err = st.Put(ctx, "k", int64(len(body)), &cancelHalfway{data: body, cancel: cancel}, backend.PutOptions{})
	require.ErrorIs(t, err, context.Canceled)
	ok, err := st.Exists(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, ok)
}

// Regression (review): two URL shapes printed their secrets: one that does
// not parse, and a secret whose value is badly escaped.
func TestRedactURLNeverLeaks(t *testing.T) {
	for _, raw := range []string{
		"s3://b/%zz?token=HUNTER2",
		"foo://x/run?secret=HUNTER2%zz",
		"gs://b/run?token=HUNTER2%zz&x=1",
		"s3://user:HUNTER2@b/run",
		"s3://b/run?X-Amz-Signature=HUNTER2&endpoint=h:1",
	} {
		require.NotContains(t, backend.RedactURL(raw), "HUNTER2", raw)
		_, err := backend.Open(context.Background(), raw)
		if err != nil {
			require.NotContains(t, err.Error(), "HUNTER2", raw)
		}
	}
	require.Equal(t, "s3://b/run?endpoint=h:1", backend.RedactURL("s3://b/run?endpoint=h:1"))
}

// A store's URL keeps the options it was opened with but drops every
// credential-like one, so a printed URL reopens the same storage and never
// leaks a secret.
func TestNonSecretQuery(t *testing.T) {
	require.Equal(t, "endpoint=127.0.0.1%3A9000&insecure=true&region=us-east-1",
		backend.NonSecretQuery("region=us-east-1&secret_key=HUNTER2&endpoint=127.0.0.1:9000&access_token=HUNTER2&insecure=true"))
	require.Empty(t, backend.NonSecretQuery("token=HUNTER2"))
	require.Empty(t, backend.NonSecretQuery("x=%zz&secret=HUNTER2"), "a query that does not parse is dropped whole")
	require.Empty(t, backend.NonSecretQuery(""))
}

package backend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/ckpterr"
)

var errFlaky = errors.New("flaky: 503 slow down")

// flaky wraps a driver and injects transient failures.
type flaky struct {
	backend.Driver
	listBreakAfter int          // List fails after this many entries (0: never)
	lostPutReply   atomic.Int32 // Puts that commit and then report a transient error
	failOpens      atomic.Int32 // NewRangeReader calls that fail transiently
	opens          atomic.Int32
}

func (f *flaky) ErrorCode(err error) backend.Code {
	if errors.Is(err, errFlaky) {
		return backend.CodeTransient
	}
	return f.Driver.ErrorCode(err)
}

func (f *flaky) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	n := 0
	return f.Driver.List(ctx, prefix, func(o backend.ObjectInfo) error {
		if f.listBreakAfter > 0 && n == f.listBreakAfter {
			return errFlaky
		}
		n++
		return fn(o)
	})
}

func (f *flaky) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	err := f.Driver.Put(ctx, key, size, r, opts)
	if err == nil && f.lostPutReply.Add(-1) >= 0 {
		return errFlaky
	}
	return err
}

func (f *flaky) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	f.opens.Add(1)
	if f.failOpens.Add(-1) >= 0 {
		return nil, errFlaky
	}
	return f.Driver.NewRangeReader(ctx, key, offset, length)
}

func flakyStore(t *testing.T) (*backend.Store, *flaky) {
	t.Helper()
	f := &flaky{Driver: mem.New()}
	st, err := backend.NewStore(f, "mem://flaky", "")
	require.NoError(t, err)
	return st.WithRetry(backend.RetryPolicy{Attempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}), f
}

// Regression (review): a listing that failed after delivering entries was
// retried into a silent success with entries missing.
func TestListFailingMidwayIsAnError(t *testing.T) {
	st, f := flakyStore(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		require.NoError(t, st.PutBytes(ctx, k, []byte(k), backend.PutOptions{}))
	}
	f.listBreakAfter = 2
	var got []string
	err := st.List(ctx, "", func(o backend.ObjectInfo) error { got = append(got, o.Key); return nil })
	require.Error(t, err, "a shortened listing must not look complete")
	require.False(t, backend.IsTransient(err))
	require.Equal(t, []string{"a", "b"}, got)
}

// Regression (review): a create-if-absent write whose reply was lost after
// it committed was retried and reported ErrAlreadyExists for its own commit.
func TestConditionalPutWithLostReplyIsOurs(t *testing.T) {
	st, f := flakyStore(t)
	ctx := context.Background()
	f.lostPutReply.Store(1)
	require.NoError(t, st.PutBytes(ctx, "meta", []byte("ours"), backend.PutOptions{IfNotExists: true}))
	// Someone else's object is still refused.
	f.lostPutReply.Store(1)
	require.NoError(t, st.PutBytes(ctx, "other", []byte("theirs"), backend.PutOptions{}))
	err := st.PutBytes(ctx, "other", []byte("ours!!"), backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
}

// Regression (review): a body that cannot be rewound lost its real error to
// "cannot be rewound" after a useless backoff.
func TestUnrewindableBodyKeepsItsError(t *testing.T) {
	st, f := flakyStore(t)
	f.lostPutReply.Store(1)
	err := st.Put(context.Background(), "k", 3, io.MultiReader(strings.NewReader("abc")), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	require.Contains(t, err.Error(), "slow down")
}

// Regression (review): ReadRange retried inside a retry, 16 opens for 4.
func TestReadRetriesAreNotMultiplied(t *testing.T) {
	st, f := flakyStore(t)
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "k", []byte("data"), backend.PutOptions{}))
	f.failOpens.Store(100)
	err := st.ReadRange(ctx, "k", 0, make([]byte, 4))
	require.ErrorIs(t, err, backend.ErrTransient)
	require.Equal(t, int32(4), f.opens.Load())
}

// A retry interrupted by cancellation reports the cancellation.
func TestCancelledBackoffReportsTheContext(t *testing.T) {
	f := &flaky{Driver: mem.New()}
	st, err := backend.NewStore(f, "mem://flaky", "")
	require.NoError(t, err)
	st = st.WithRetry(backend.RetryPolicy{Attempts: 4, BaseDelay: time.Hour, MaxDelay: time.Hour})
	f.failOpens.Store(100)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = st.NewRangeReader(ctx, "k", 0, -1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// lateReader is a driver whose first Put fails transiently at once but, as
// net/http's transport may, keeps reading that attempt's body after Put has
// returned: it reads while the retry is sending its own copy.
type lateReader struct {
	backend.Driver
	calls     atomic.Int32
	retrying  chan struct{} // closed when the second attempt has started
	lateDone  chan struct{} // closed when the late read has happened
	lateBytes atomic.Int64
}

func (d *lateReader) ErrorCode(err error) backend.Code {
	if errors.Is(err, errFlaky) {
		return backend.CodeTransient
	}
	return d.Driver.ErrorCode(err)
}

func (d *lateReader) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if d.calls.Add(1) == 1 {
		go func() {
			defer close(d.lateDone)
			<-d.retrying
			n, _ := r.Read(make([]byte, 4))
			d.lateBytes.Store(int64(n))
		}()
		return errFlaky
	}
	close(d.retrying)
	<-d.lateDone
	return d.Driver.Put(ctx, key, size, r, opts)
}

// Regression (review of the async saves): every attempt of a Put shared one
// body, so a failed attempt's late read (net/http closes or drains a request
// body in another goroutine, even after RoundTrip returned) took bytes from
// the retry's stream: the retry failed with a size mismatch, or would have
// published shifted bytes.
func TestFailedAttemptsLateReadDoesNotStealTheRetrysBytes(t *testing.T) {
	for name, src := range map[string]func([]byte) io.Reader{
		"bytes.Reader":   func(b []byte) io.Reader { return bytes.NewReader(b) },
		"strings.Reader": func(b []byte) io.Reader { return strings.NewReader(string(b)) },
	} {
		t.Run(name, func(t *testing.T) {
			d := &lateReader{Driver: mem.New(), retrying: make(chan struct{}), lateDone: make(chan struct{})}
			st, err := backend.NewStore(d, "mem://late", "")
			require.NoError(t, err)
			st = st.WithRetry(backend.RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
			ctx := context.Background()
			data := []byte("0123456789abcdef")
			require.NoError(t, st.Put(ctx, "k", int64(len(data)), src(data), backend.PutOptions{}))
			require.Zero(t, d.lateBytes.Load(), "the failed attempt's body must be dead once its Put returned")
			got, err := st.ReadAll(ctx, "k", 0)
			require.NoError(t, err)
			require.Equal(t, data, got)
		})
	}
}

// selfBounded is a driver that bounds its own requests, as the S3 driver
// bounds the start of a multipart upload on a context of its own: its Put
// waits for a bound of d and fails with that context's error.
type selfBounded struct {
	backend.Driver
	d     time.Duration
	calls atomic.Int32
}

func (s *selfBounded) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	s.calls.Add(1)
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.d)
	defer cancel()
	select {
	case <-bctx.Done():
		return fmt.Errorf("start upload of %s: %w", key, bctx.Err())
	case <-ctx.Done():
		return fmt.Errorf("start upload of %s: %w", key, ctx.Err())
	}
}

// Regression (issue 30 item 2): with the S3 server stopped mid-save, a
// request bounded by a deadline of the driver's own ran out, the context
// error was classed as a cancellation, and `ckpt train` exited 130 as if
// interrupted though no signal was sent. A driver's own bound running out
// while the caller's context is live is transient (retried, exit 5); a
// cancellation by the caller stays a cancellation.
func TestDriversOwnDeadlineIsTransientNotCancellation(t *testing.T) {
	d := &selfBounded{Driver: mem.New(), d: time.Millisecond}
	st, err := backend.NewStore(d, "mem://bounded", "")
	require.NoError(t, err)
	st = st.WithRetry(backend.RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	err = st.PutBytes(context.Background(), "k", []byte("v"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	require.Equal(t, ckpterr.Transient, ckpterr.ClassOf(err), "%v", err)
	require.NotErrorIs(t, err, ckpterr.ErrCanceled)
	require.Equal(t, int32(3), d.calls.Load(), "retried under the policy")
	require.Contains(t, err.Error(), "mem://bounded/k")

	d.d = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	err = st.PutBytes(ctx, "k", []byte("v"), backend.PutOptions{})
	require.Equal(t, ckpterr.Canceled, ckpterr.ClassOf(err), "%v", err)
}

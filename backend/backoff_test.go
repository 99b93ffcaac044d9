package backend_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/mem"
)

func TestBackoffDoublesWithJitterUpToTheCap(t *testing.T) {
	b := backend.Backoff{Base: 100 * time.Millisecond, Max: 400 * time.Millisecond}
	for i, hi := range []time.Duration{100, 200, 400, 400, 400} {
		hi *= time.Millisecond
		d := b.Next()
		assert.GreaterOrEqual(t, d, hi/2, "delay %d", i)
		assert.LessOrEqual(t, d, hi, "delay %d", i)
	}
	var zero backend.Backoff
	assert.Zero(t, zero.Next())
}

// partDriver is a driver whose Put sends parts that always fail
// transiently, retried with RetryWithin like the S3 driver's parts.
type partDriver struct {
	backend.Driver
	parts atomic.Int32
}

func (p *partDriver) ErrorCode(err error) backend.Code {
	if err == errFlaky {
		return backend.CodeTransient
	}
	return p.Driver.ErrorCode(err)
}

func (p *partDriver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	return backend.RetryWithin(ctx, p.ErrorCode, func() error { p.parts.Add(1); return errFlaky })
}

// Part retries and the Store's retries share one budget: a part that keeps
// failing is sent Attempts times in all, whether the body rewinds or not.
func TestRetryWithinDrawsFromTheStoreBudget(t *testing.T) {
	for _, rewind := range []bool{true, false} {
		d := &partDriver{Driver: mem.New()}
		st, err := backend.NewStore(d, "mem://parts", "")
		require.NoError(t, err)
		st = st.WithRetry(backend.RetryPolicy{Attempts: 4, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
		var body io.Reader = io.NewSectionReader(zeroes{}, 0, 10)
		if !rewind {
			body = io.LimitReader(zeroes{}, 10)
		}
		err = st.Put(context.Background(), "k", 10, body, backend.PutOptions{})
		require.ErrorIs(t, err, backend.ErrTransient)
		assert.Equal(t, int32(4), d.parts.Load(), "part requests (rewindable body: %v)", rewind)
	}
}

// A driver used without a Store makes one attempt.
func TestRetryWithinWithoutAStoreRunsOnce(t *testing.T) {
	n := 0
	err := backend.RetryWithin(context.Background(), func(error) backend.Code { return backend.CodeTransient }, func() error { n++; return errFlaky })
	require.ErrorIs(t, err, errFlaky)
	assert.Equal(t, 1, n)
}

// RetryPolicy.Budget stops retries once spent, whatever attempts are left.
func TestRetryTimeBudget(t *testing.T) {
	st, f := flakyStore(t)
	st = st.WithRetry(backend.RetryPolicy{Attempts: 100, BaseDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Budget: 50 * time.Millisecond})
	require.NoError(t, st.PutBytes(context.Background(), "k", []byte("v"), backend.PutOptions{}))
	f.failOpens.Store(1000)
	start := time.Now()
	err := st.ReadRange(context.Background(), "k", 0, make([]byte, 1))
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Less(t, f.opens.Load(), int32(10), "opens within a 50ms budget of 10-20ms backoffs")
	assert.Less(t, time.Since(start), time.Second)
}

type zeroes struct{}

func (zeroes) ReadAt(p []byte, _ int64) (int, error) { clear(p); return len(p), nil }
func (zeroes) Read(p []byte) (int, error)            { clear(p); return len(p), nil }

// flakyParts is a driver whose Put sends n parts, each failing
// transiently once before it succeeds.
type flakyParts struct {
	backend.Driver
	n        int
	requests atomic.Int32
}

func (p *flakyParts) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	for range p.n {
		failed := false
		err := backend.RetryWithin(ctx, func(error) backend.Code { return backend.CodeTransient }, func() error {
			p.requests.Add(1)
			if !failed {
				failed = true
				return errFlaky
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Every part has the policy's attempts of its own: ten parts that each
// fail once succeed with Attempts 2 (one shared pool of retries would
// have failed the upload at the second part).
func TestRetryWithinAttemptsArePerRequest(t *testing.T) {
	d := &flakyParts{Driver: mem.New(), n: 10}
	st, err := backend.NewStore(d, "mem://parts", "")
	require.NoError(t, err)
	st = st.WithRetry(backend.RetryPolicy{Attempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	require.NoError(t, st.Put(context.Background(), "k", 10, io.LimitReader(zeroes{}, 10), backend.PutOptions{}))
	assert.Equal(t, int32(20), d.requests.Load())
}

package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type thing struct{ n int }

func isUsage(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err), "%v", err)
}

func TestHandleTableRefusesZeroRandomClosedStaleAndWrongType(t *testing.T) {
	var tb handleTable
	h := tb.add(&thing{1})
	v, release, err := acquire[*thing](&tb, h, "thing")
	require.NoError(t, err)
	assert.Equal(t, 1, v.n)
	release()
	release() // idempotent

	_, _, err = acquire[*thing](&tb, 0, "thing")
	isUsage(t, err)
	assert.Contains(t, err.Error(), "handle is 0")
	for range 1000 {
		r := rand.Uint64()
		if r == h {
			continue
		}
		_, _, err = acquire[*thing](&tb, r, "thing")
		isUsage(t, err)
	}
	_, _, err = acquire[*storeHandle](&tb, h, "store")
	isUsage(t, err)
	assert.Contains(t, err.Error(), "is not a store")

	got, err := remove[*thing](&tb, h, "thing")
	require.NoError(t, err)
	assert.Equal(t, 1, got.n)
	_, _, err = acquire[*thing](&tb, h, "thing")
	isUsage(t, err)
	_, err = remove[*thing](&tb, h, "thing") // closed twice
	isUsage(t, err)

	// The slot is reused with another generation: the old handle stays dead.
	h2 := tb.add(&thing{2})
	assert.NotEqual(t, h, h2)
	assert.Equal(t, h&0xffffffff, h2&0xffffffff, "slot reused")
	_, _, err = acquire[*thing](&tb, h, "thing")
	isUsage(t, err)
	v, release, err = acquire[*thing](&tb, h2, "thing")
	require.NoError(t, err)
	assert.Equal(t, 2, v.n)
	release()
	assert.Equal(t, 1, tb.live())
}

func TestHandleCloseWaitsForCallsInFlight(t *testing.T) {
	var tb handleTable
	h := tb.add(&thing{1})
	_, release, err := acquire[*thing](&tb, h, "thing")
	require.NoError(t, err)
	removed := make(chan error)
	go func() {
		_, err := remove[*thing](&tb, h, "thing")
		removed <- err
	}()
	// Closing: new calls fail at once, the close waits for the call.
	require.Eventually(t, func() bool {
		_, rel, err := acquire[*thing](&tb, h, "thing")
		if err == nil {
			rel() // not closing yet
		}
		return err != nil && strings.Contains(err.Error(), "is closed")
	}, 5*time.Second, time.Millisecond)
	select {
	case err := <-removed:
		t.Fatalf("close returned (%v) while a call held the handle", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	require.NoError(t, <-removed)
	assert.Equal(t, 0, tb.live())
}

// TestHandleCallsRaceClose is the read-vs-close race of the Python binding
// at the table's level: calls on a handle from several goroutines while
// another closes it either run on a live value or fail with a usage error,
// and the value is never released under a call (run with -race).
func TestHandleCallsRaceClose(t *testing.T) {
	var tb handleTable
	for range 200 {
		var freed atomic.Bool
		h := tb.add(&thing{1})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					v, release, err := acquire[*thing](&tb, h, "thing")
					if err != nil {
						if ckpterr.ClassOf(err) != ckpterr.Usage {
							t.Errorf("class %v: %v", ckpterr.ClassOf(err), err)
						}
						return
					}
					if freed.Load() || v.n != 1 {
						t.Error("a call ran on a released value")
					}
					release()
				}
			})
		}
		wg.Go(func() {
			v, err := remove[*thing](&tb, h, "thing")
			if err != nil {
				t.Error(err)
				return
			}
			freed.Store(true)
			v.n = 0
		})
		wg.Wait()
	}
	assert.Equal(t, 0, tb.live())
}

func TestProtectRecoversPanicAsInternal(t *testing.T) {
	err := protect("ckpt_test", func() error { panic("boom") })
	require.Error(t, err)
	assert.Equal(t, ckpterr.Internal, ckpterr.ClassOf(err))
	assert.Contains(t, err.Error(), "ckpt_test")
	assert.Contains(t, err.Error(), "panic: boom")

	var nilMap map[string]int
	err = protect("ckpt_test", func() error { nilMap["x"] = 1; return nil })
	assert.Equal(t, ckpterr.Internal, ckpterr.ClassOf(err))

	want := errors.New("plain")
	assert.Equal(t, want, protect("ckpt_test", func() error { return want }))
}

func TestCancelTokenCancelsItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := handles.add(&cancelToken{ctx: ctx, cancel: cancel})
	tok, release, err := acquire[*cancelToken](&handles, h, "cancellation token")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		// A long call waits on the token's context.
		<-tok.ctx.Done()
		done <- tok.ctx.Err()
	}()
	tok.cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, ckpterr.Canceled, ckpterr.ClassOf(err))
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not see the cancellation")
	}
	release()
	_, err = remove[*cancelToken](&handles, h, "cancellation token")
	require.NoError(t, err)
}

// TestOpenUsesTheEnvironmentPassed: an open under backend.WithEnv reads the
// S3 endpoint and region from the map, never from the process environment.
func TestOpenUsesTheEnvironmentPassed(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://stale.invalid:1")
	ctx := backend.WithEnv(context.Background(), map[string]string{"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_REGION": "eu-x-1"})
	sh, err := openStore(ctx, "s3://bucket/p")
	require.NoError(t, err)
	defer func() { _ = closeStore(sh) }()
	d, ok := sh.st.Driver().(*s3.Driver)
	require.True(t, ok)
	assert.Equal(t, "127.0.0.1:9", d.Options().Endpoint)
	assert.Equal(t, "eu-x-1", d.Options().Region)
}

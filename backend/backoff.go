package backend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Backoff is ckptkit's one backoff schedule: exponential (doubling from
// Base, capped at Max) with jitter, each delay drawn uniformly from
// [d/2, d) so that concurrent retries spread out. The zero Backoff waits
// no time. It is not safe for concurrent use; make one per retry chain.
//
// It is hand-written (a dozen lines) rather than taken from a dependency:
// the backend package imports only the standard library, and the SDKs'
// own (minio-go's, gax-go's) are unexported or pull gRPC in.
type Backoff struct {
	// Base is the first delay's upper bound.
	Base time.Duration
	// Max caps every delay (0: no cap).
	Max time.Duration
	n   int
}

// Next returns the delay before the next retry and advances the schedule.
func (b *Backoff) Next() time.Duration {
	if b.Base <= 0 {
		return 0
	}
	d := b.Base << min(b.n, 30)
	if d <= 0 || (b.Max > 0 && d > b.Max) {
		d = b.Max
	}
	b.n++
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Wait sleeps for the next delay, returning early with ctx's error when
// ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// budget is what one Store call may still spend on retries: attempts left
// and a deadline. It is shared by the call's own retry loop and by the
// driver retrying a smaller unit (an upload part) inside it, so that the
// two never multiply: one failing request is tried Attempts times in all.
type budget struct {
	left     atomic.Int64
	deadline time.Time // zero: none
	policy   RetryPolicy
}

// take spends one retry; false when none is left or the deadline passed.
func (b *budget) take() bool {
	if !b.deadline.IsZero() && time.Now().After(b.deadline) {
		return false
	}
	return b.left.Add(-1) >= 0
}

type budgetKey struct{}

// RetryWithin runs f, one request that is a part of a Store call (an upload
// part of a multipart Put, say), and retries it on errors code classifies
// as CodeTransient, drawing every retry from the retry budget of the Store
// call that ctx belongs to: a driver that can retry a part cheaply does so
// without multiplying the Store's own retries, and a part that keeps failing
// fails the call with the budget spent, so the Store does not retry it
// again. Without a Store call in ctx (a driver used directly) f runs once.
func RetryWithin(ctx context.Context, code func(error) Code, f func() error) error {
	b, _ := ctx.Value(budgetKey{}).(*budget)
	var bo *Backoff
	for {
		err := f()
		if err == nil || b == nil || code(err) != CodeTransient || ctx.Err() != nil || !b.take() {
			return err
		}
		if bo == nil {
			bo = &Backoff{Base: b.policy.BaseDelay, Max: b.policy.MaxDelay}
		}
		if werr := bo.Wait(ctx); werr != nil {
			return fmt.Errorf("%w (while retrying: %w)", werr, err)
		}
	}
}

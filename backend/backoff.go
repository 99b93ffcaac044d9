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

// Retry runs f, and again after each transient failure (IsTransient), up
// to policy.Attempts tries in all with the policy's backoff between them,
// until ctx ends; it returns how many times it retried. It is the Store's
// own retry loop, for a unit of work larger than one Store call that can
// be started over as a whole (a checkpoint copy whose streamed uploads the
// Store cannot replay, say).
func Retry(ctx context.Context, policy RetryPolicy, f func() error) (int, error) {
	left, n := max(policy.Attempts, 1)-1, 0
	err := retryEach(ctx, policy, func(error) bool {
		if left == 0 {
			return false
		}
		left, n = left-1, n+1
		return true
	}, f)
	return n, err
}

// retryEach is the one retry loop: f, then, while its error is transient,
// ctx lives and more agrees, a backoff wait and f again.
func retryEach(ctx context.Context, policy RetryPolicy, more func(err error) bool, f func() error) error {
	bo := Backoff{Base: policy.BaseDelay, Max: policy.MaxDelay}
	for {
		err := f()
		if err == nil || !IsTransient(err) || ctx.Err() != nil || !more(err) {
			return err
		}
		if werr := bo.Wait(ctx); werr != nil {
			return fmt.Errorf("%w (while retrying: %w)", werr, err)
		}
	}
}

// budget is what one Store call may still spend on retries: attempts left
// and a deadline. The driver retrying a smaller unit inside the call (an
// upload part) uses the same policy and deadline, and a unit that used up
// its attempts spends the call's budget too, so that the two layers never
// multiply: one failing request is tried Attempts times in all.
type budget struct {
	left     atomic.Int64
	deadline time.Time // zero: none
	policy   RetryPolicy
}

// expired reports whether the call's time budget is over.
func (b *budget) expired() bool { return !b.deadline.IsZero() && time.Now().After(b.deadline) }

// take spends one retry of the call; false when none is left or the
// deadline passed.
func (b *budget) take() bool {
	if b.expired() {
		return false
	}
	return b.left.Add(-1) >= 0
}

type budgetKey struct{}

// RetryWithin runs f, one request that is a unit of a Store call (an upload
// part of a multipart Put, say), and retries it on errors code classifies
// as CodeTransient under the Store's policy: up to RetryPolicy.Attempts
// tries of this request, within the call's time budget. A request that
// used up its tries also ends the call's retries, so the Store does not
// start the call again: a request that keeps failing is sent Attempts
// times in all, never Attempts times the Store's count. Units that fail
// and then succeed cost the call nothing. Without a Store call in ctx (a
// driver used directly) f runs once.
func RetryWithin(ctx context.Context, code func(error) Code, f func() error) error {
	b, _ := ctx.Value(budgetKey{}).(*budget)
	if b == nil {
		return f()
	}
	left := max(b.policy.Attempts, 1) - 1
	bo := Backoff{Base: b.policy.BaseDelay, Max: b.policy.MaxDelay}
	for {
		err := f()
		if err == nil || code(err) != CodeTransient || ctx.Err() != nil {
			return err
		}
		if left == 0 || b.expired() {
			b.left.Store(0) // tried Attempts times: the Store must not retry it again
			return err
		}
		left--
		if werr := bo.Wait(ctx); werr != nil {
			return fmt.Errorf("%w (while retrying: %w)", werr, err)
		}
	}
}

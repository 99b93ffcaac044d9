package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultStallTimeout is how long a storage request may go without
// progress (no byte of it sent, no byte of its answer received) before it
// fails as stalled, when neither the URL (stall_timeout) nor the
// environment (StallTimeoutEnv) says otherwise.
//
// 60 s is longer than any silence of a healthy service in the middle of a
// request: S3 answers a long CompleteMultipartUpload with its header at
// once and then keeps the connection alive with white space, GCS answers
// each resumable chunk as it lands, and TCP retransmits a lost segment
// well within it on a network that recovers from a blip. It equals the
// response-header timeout minio-go's transport already had. And it is short
// enough that a server that stopped answering (SIGSTOP, a black-holed
// connection, a wedged load balancer) fails a save with a transient error
// after the policy's 4 attempts, about 4 minutes, rather than hanging it.
const DefaultStallTimeout = 60 * time.Second

// StallTimeoutEnv is the environment variable that sets the stall timeout
// of every Store Open returns (a Go duration such as 30s or 2m; 0 turns
// the deadline off). A stall_timeout URL option overrides it.
const StallTimeoutEnv = "CKPTKIT_STALL_TIMEOUT"

// StallTimeoutOption is the URL query option that sets a Store's stall
// timeout (stall_timeout=30s); Open takes it out of the query before the
// driver sees the URL, so it works with every scheme.
const StallTimeoutOption = "stall_timeout"

// StallError is a storage request that made no progress for the Store's
// stall timeout: the server accepted it and went silent (stopped,
// overloaded, a connection black-holed on the way). It is distinct from a
// cancellation: no caller gave up, storage did not answer. It is
// transient (ckpterr class Transient, exit code 5): the Store retries it
// under its RetryPolicy like a reset connection.
type StallError struct {
	// Request names the request: its method and URL without the query
	// (a query may carry credentials, such as a GCS session URI).
	Request string
	// Waiting says what the request was waiting for when it stalled.
	Waiting string
	// Waited is how long it went without progress (the stall timeout).
	Waited time.Duration
}

// Error implements error. It does not repeat Request: net/http's
// *url.Error around it names the request already.
func (e *StallError) Error() string {
	return fmt.Sprintf("storage stalled: no progress for %s while %s (stall timeout: URL option %s or %s)",
		e.Waited, e.Waiting, StallTimeoutOption, StallTimeoutEnv)
}

// Is makes a StallError match ErrTransient and, through it, the ckpterr
// class Transient.
func (e *StallError) Is(target error) bool { return errors.Is(ErrTransient, target) }

// Timeout reports true, as the net.Error of a timed-out connection does.
func (e *StallError) Timeout() bool { return true }

type stallKey struct{}

// ContextWithStallTimeout returns ctx carrying the stall timeout d (0:
// none) for the requests made under it. Every Store call puts its store's
// there; a caller of a driver without a Store can too.
func ContextWithStallTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, stallKey{}, max(d, 0))
}

// StallTimeout returns the stall timeout of the Store call ctx belongs to,
// for the transports of drivers that watch their requests (backend/stall);
// DefaultStallTimeout when ctx carries none (a driver used without a
// Store). Zero means no deadline.
func StallTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(stallKey{}).(time.Duration); ok {
		return d
	}
	return DefaultStallTimeout
}

// ParseStallTimeout parses a stall timeout as the URL option and the
// environment variable give it: a Go duration ("30s", "2m"); "0" turns the
// deadline off.
func ParseStallTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("stall timeout %q is not a non-negative duration such as 30s or 2m", s)
	}
	return d, nil
}

// stallTimeoutFromEnv returns the stall timeout StallTimeoutEnv sets in
// the environment of an open under ctx (Getenv), or DefaultStallTimeout
// when it is unset.
func stallTimeoutFromEnv(ctx context.Context) (time.Duration, error) {
	v := Getenv(ctx, StallTimeoutEnv)
	if v == "" {
		return DefaultStallTimeout, nil
	}
	d, err := ParseStallTimeout(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", StallTimeoutEnv, err)
	}
	return d, nil
}

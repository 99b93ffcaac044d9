package backend_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

func TestCodeForHTTPStatus(t *testing.T) {
	for status, want := range map[int]backend.Code{
		200: backend.CodeUnknown,
		400: backend.CodeUnknown,
		401: backend.CodeUnknown,
		403: backend.CodePermission,
		404: backend.CodeNotFound,
		408: backend.CodeTransient,
		409: backend.CodeUnknown,
		412: backend.CodeAlreadyExists,
		429: backend.CodeTransient,
		500: backend.CodeTransient,
		502: backend.CodeTransient,
		503: backend.CodeTransient,
		599: backend.CodeTransient,
	} {
		assert.Equal(t, want, backend.CodeForHTTPStatus(status), "status %d", status)
	}
}

// timeoutErr is a net.Error whose Timeout is configurable.
type timeoutErr struct{ timeout bool }

func (e timeoutErr) Error() string   { return "net op failed" }
func (e timeoutErr) Timeout() bool   { return e.timeout }
func (e timeoutErr) Temporary() bool { return false }

func TestNetworkErrorCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want backend.Code
	}{
		{nil, backend.CodeUnknown},
		{errors.New("plain"), backend.CodeUnknown},
		{syscall.ECONNRESET, backend.CodeTransient},
		{syscall.ECONNABORTED, backend.CodeTransient},
		{syscall.EPIPE, backend.CodeTransient},
		{syscall.ECONNREFUSED, backend.CodeTransient},
		{syscall.ENOENT, backend.CodeUnknown},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, backend.CodeTransient},
		{fmt.Errorf("read: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), backend.CodeTransient},
		{fmt.Errorf("wrapped: %w", timeoutErr{timeout: true}), backend.CodeTransient},
		{timeoutErr{timeout: false}, backend.CodeUnknown},
		{os.ErrDeadlineExceeded, backend.CodeTransient},
		// Regression (review): TLS alerts, which crypto/tls wraps in an
		// OpError, were retried until the budget ran out.
		{fmt.Errorf("put: %w", &net.OpError{Op: "remote error", Err: tls.AlertError(116)}), backend.CodeUnknown},
		{&net.OpError{Op: "local error", Err: tls.AlertError(40)}, backend.CodeUnknown},
	} {
		assert.Equal(t, tc.want, backend.NetworkErrorCode(tc.err), "%v", tc.err)
	}
}

// Regression: a host that does not resolve was unclassified (CLI exit 10);
// it is the URL's fault, a usage error, while a temporary DNS failure stays
// transient.
func TestUnresolvableHostIsAUsageError(t *testing.T) {
	notFound := &backend.Error{Op: "list", URL: "s3://b/x", Code: backend.CodeUnknown,
		Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "nonexistent.invalid", IsNotFound: true}}}
	assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(fmt.Errorf("ls: %w", notFound)))
	temporary := &net.OpError{Op: "dial", Err: &net.DNSError{Err: "server misbehaving", Name: "h", IsTemporary: true}}
	require.Equal(t, backend.CodeTransient, backend.NetworkErrorCode(temporary))
}

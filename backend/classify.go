package backend

import (
	"errors"
	"io"
	"net"
	"net/textproto"
	"syscall"
)

// HTTP statuses CodeForHTTPStatus maps; spelled out here so the core package
// does not link net/http for four constants.
const (
	statusForbidden          = 403
	statusNotFound           = 404
	statusRequestTimeout     = 408
	statusPreconditionFailed = 412
	statusTooManyRequests    = 429
)

// CodeForHTTPStatus classifies an HTTP status of a failed request: 404 is
// CodeNotFound, 412 (a create-if-absent precondition) CodeAlreadyExists, 403
// CodePermission, and 408, 429 and every 5xx CodeTransient. Any other status
// is CodeUnknown. Drivers call it after their service-specific error codes.
func CodeForHTTPStatus(status int) Code {
	switch {
	case status == statusNotFound:
		return CodeNotFound
	case status == statusPreconditionFailed:
		return CodeAlreadyExists
	case status == statusForbidden:
		return CodePermission
	case status == statusTooManyRequests, status == statusRequestTimeout, status >= 500:
		return CodeTransient
	}
	return CodeUnknown
}

// NetworkErrorCode classifies a transport failure as CodeTransient: a
// reset, aborted, refused or timed-out connection, a broken pipe, an
// unreachable network, a connection closed early (io.EOF or
// io.ErrUnexpectedEOF anywhere in err's chain: the server or a proxy
// closed it before the response or its body was complete), a malformed
// response header (textproto.ProtocolError: the connection broke inside
// the header block), any other *net.OpError but a failed name lookup or a
// TLS alert ("remote error", "local error": retrying cannot help), or
// a net.Error timeout. Anything else is CodeUnknown. Drivers call it
// after their service-specific error codes, so a complete error response
// is classified by its status, never here.
func NetworkErrorCode(err error) Code {
	for _, e := range []error{syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.ECONNREFUSED,
		syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETRESET,
		io.EOF, io.ErrUnexpectedEOF, net.ErrClosed} {
		if errors.Is(err, e) {
			return CodeTransient
		}
	}
	var pe textproto.ProtocolError
	if errors.As(err, &pe) {
		return CodeTransient
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return CodeTransient
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return CodeUnknown
		}
		return CodeTransient
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		if oe.Op == "remote error" || oe.Op == "local error" {
			// crypto/tls reports a TLS alert (a refused certificate, a
			// protocol mismatch) as an OpError: retrying cannot help.
			return CodeUnknown
		}
		return CodeTransient
	}
	return CodeUnknown
}

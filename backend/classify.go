package backend

import (
	"errors"
	"net"
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

// NetworkErrorCode classifies a transport failure: a reset, aborted or
// refused connection, a broken pipe or a net.Error timeout anywhere in err's
// chain is CodeTransient; anything else is CodeUnknown.
func NetworkErrorCode(err error) Code {
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNREFUSED) {
		return CodeTransient
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return CodeTransient
	}
	return CodeUnknown
}

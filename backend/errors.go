package backend

import (
	"errors"
	"fmt"
	"net"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/keys"
)

// Portable error sentinels. Every error returned by a Store matches at most
// one of them through errors.Is, whatever backend produced it.
var (
	// ErrNotFound: the object does not exist.
	ErrNotFound = ckpterr.New(ckpterr.NotFound, "object not found")
	// ErrAlreadyExists: a create-if-absent write lost to an existing object.
	ErrAlreadyExists = ckpterr.New(ckpterr.Conflict, "object already exists")
	// ErrPermission: the credentials do not allow the operation.
	ErrPermission = ckpterr.New(ckpterr.Access, "permission denied")
	// ErrUnsupported: the backend cannot perform the operation or option.
	ErrUnsupported = ckpterr.New(ckpterr.Unsupported, "operation not supported by backend")
	// ErrInvalidKey: the key is empty, absolute, holds NUL or tries to escape
	// its prefix with "..". Raised before any driver sees the key. It is
	// keys.ErrInvalidKey, the sentinel of the one key syntax.
	ErrInvalidKey = keys.ErrInvalidKey
	// ErrSizeMismatch: a write delivered a different number of bytes than it
	// declared; nothing was published.
	ErrSizeMismatch = ckpterr.New(ckpterr.BadCheckpoint, "written size does not match declared size")
	// ErrTransient: a failure that may succeed when retried (5xx, throttling,
	// connection reset). Errors not matching it are permanent.
	ErrTransient = ckpterr.New(ckpterr.Transient, "transient backend failure")
	// ErrObjectTooLarge: ReadAll found the object larger than the caller's
	// limit (it stops reading there). Callers that know what the object is
	// reclassify it (an oversized metadata object is a bad checkpoint).
	ErrObjectTooLarge = ckpterr.New(ckpterr.Unsupported, "object larger than the read limit")
	// ErrUnknownScheme: no driver is registered for the URL's scheme.
	ErrUnknownScheme = ckpterr.New(ckpterr.Usage, "unknown URL scheme")
)

// Code classifies a driver error. Drivers map their native errors to a Code
// in Driver.ErrorCode; the Store turns the code into the matching sentinel.
type Code int

// Error codes, one per sentinel. CodeUnknown is a permanent error of no
// particular class.
const (
	CodeUnknown Code = iota
	CodeNotFound
	CodeAlreadyExists
	CodePermission
	CodeUnsupported
	CodeInvalidKey
	CodeSizeMismatch
	CodeTransient
	CodeCanceled
)

// Sentinel returns the sentinel error of c, or nil for CodeUnknown and
// CodeCanceled.
func (c Code) Sentinel() error {
	switch c {
	case CodeNotFound:
		return ErrNotFound
	case CodeAlreadyExists:
		return ErrAlreadyExists
	case CodePermission:
		return ErrPermission
	case CodeUnsupported:
		return ErrUnsupported
	case CodeInvalidKey:
		return ErrInvalidKey
	case CodeSizeMismatch:
		return ErrSizeMismatch
	case CodeTransient:
		return ErrTransient
	}
	return nil
}

// Class returns the ckpterr class of c: the class of its sentinel,
// Canceled for CodeCanceled, Internal for CodeUnknown. The plugin protocol
// carries codes, so this mapping is also how a class crosses it.
func (c Code) Class() ckpterr.Class {
	if c == CodeCanceled {
		return ckpterr.Canceled
	}
	if s, ok := c.Sentinel().(*ckpterr.Sentinel); ok {
		return s.Class()
	}
	return ckpterr.Internal
}

// String names the code.
func (c Code) String() string {
	switch c {
	case CodeNotFound:
		return "not-found"
	case CodeAlreadyExists:
		return "already-exists"
	case CodePermission:
		return "permission"
	case CodeUnsupported:
		return "unsupported"
	case CodeInvalidKey:
		return "invalid-key"
	case CodeSizeMismatch:
		return "size-mismatch"
	case CodeTransient:
		return "transient"
	case CodeCanceled:
		return "canceled"
	}
	return "unknown"
}

// CodeOf returns the portable code of err: the code of a *Error in its chain,
// else the code of the first sentinel it matches, else CodeCanceled for
// context errors, else CodeUnknown. Drivers may use it for errors they built
// from the sentinels themselves.
func CodeOf(err error) Code {
	if err == nil {
		return CodeUnknown
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	for _, c := range []Code{CodeNotFound, CodeAlreadyExists, CodePermission, CodeUnsupported, CodeInvalidKey, CodeSizeMismatch, CodeTransient} {
		if errors.Is(err, c.Sentinel()) {
			return c
		}
	}
	if isContextErr(err) {
		return CodeCanceled
	}
	return CodeUnknown
}

// Error is the error every Store method returns: the operation, the object
// (as a URL without credentials), the portable code and the driver's error.
type Error struct {
	Op   string // "read", "write", "stat", "list", "delete"
	URL  string // redacted URL of the object or prefix
	Code Code
	Err  error // the driver's error
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, e.URL, e.Err)
}

// Unwrap returns the driver error, so context.Canceled and driver types stay
// reachable through errors.Is/As.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's code and, through it, the
// sentinel's ckpterr class.
func (e *Error) Is(target error) bool {
	s := e.Code.Sentinel()
	return s != nil && errors.Is(s, target)
}

// Class returns the ckpterr class of the error's code (Internal for
// CodeUnknown, so that ckpterr.ClassOf looks at the driver's error).
//
// A host name that does not resolve (an endpoint mistyped in the URL or the
// environment) is a usage error: retrying cannot fix it, and it is no bug.
func (e *Error) Class() ckpterr.Class {
	var dns *net.DNSError
	if e.Code == CodeUnknown && errors.As(e.Err, &dns) && dns.IsNotFound {
		return ckpterr.Usage
	}
	return e.Code.Class()
}

// IsTransient reports whether err is worth retrying.
func IsTransient(err error) bool { return errors.Is(err, ErrTransient) }

package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/ckpterr"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	// ErrPluginExited is wrapped by errors of calls whose plugin process
	// exited (crashed, was killed) or whose connection broke mid-call. The
	// next call restarts the plugin.
	ErrPluginExited = ckpterr.New(ckpterr.Transient, "plugin process exited")
	// ErrPluginClosed is returned by calls on a driver whose plugin was
	// closed with Close or CloseAll.
	ErrPluginClosed = ckpterr.New(ckpterr.Canceled, "plugin closed")
	// ErrChecksumMismatch is wrapped by Discover's error for a binary whose
	// SHA-256 differs from its pin; such a binary is never executed.
	ErrChecksumMismatch = ckpterr.New(ckpterr.Access, "plugin binary does not match its SHA-256 pin")
)

// CallError is the error of a call forwarded to a plugin. It carries the
// portable code the plugin attached (or the host's own classification of a
// transport failure), so errors.Is matches the backend sentinels, and it
// unwraps to context errors and ErrPluginExited where they apply.
type CallError struct {
	Plugin string       // plugin name
	Op     string       // "read", "write", "stat", "list", "delete", "open", ...
	Code   backend.Code // portable classification
	Err    error
}

// Error implements error.
func (e *CallError) Error() string { return fmt.Sprintf("plugin %s: %s: %v", e.Plugin, e.Op, e.Err) }

// Unwrap returns the cause.
func (e *CallError) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's code and, through it, its class.
func (e *CallError) Is(target error) bool {
	s := e.Code.Sentinel()
	return s != nil && errors.Is(s, target)
}

// Class returns the ckpterr class of the error's code.
func (e *CallError) Class() ckpterr.Class { return e.Code.Class() }

// remoteError carries a plugin's message without re-wrapping it.
type remoteError struct{ msg string }

func (e remoteError) Error() string { return e.msg }

// crashPolicy says how a call that lost its plugin is classified.
type crashPolicy int

const (
	// crashRetryable: nothing the call did can have taken effect twice
	// (reads, stats, listings, deletes, opens, and writes whose body was not
	// yet touched): the Store may retry it on a restarted plugin.
	crashRetryable crashPolicy = iota
	// crashNotCommitted: a write whose body was partly sent; it was not
	// published (no commit frame went out) but its source was consumed, so
	// it is never replayed here.
	crashNotCommitted
	// crashAmbiguous: the commit frame went out; the plugin may or may not
	// have published before dying.
	crashAmbiguous
)

// convert classifies err from a call on in. ctx is the caller's context.
func (p *Plugin) convert(ctx context.Context, in *instance, op string, err error, policy crashPolicy) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return &CallError{Plugin: p.Name, Op: op, Code: backend.CodeCanceled, Err: context.Cause(ctx)}
	}
	st, isStatus := status.FromError(err)
	if isStatus {
		if code, msg, ok := wire.Detail(st); ok {
			return &CallError{Plugin: p.Name, Op: op, Code: code, Err: remoteError{msg}}
		}
	}
	exited := in != nil && in.ctx.Err() != nil
	if exited || (isStatus && (st.Code() == codes.Unavailable || st.Code() == codes.Canceled)) {
		// Without the plugin's own detail, Unavailable means the connection
		// is gone: give up on this process so the next call restarts it.
		if in != nil {
			in.abandon()
		}
		e := &CallError{Plugin: p.Name, Op: op, Code: backend.CodeTransient}
		switch policy {
		case crashRetryable:
			e.Err = fmt.Errorf("%w or lost its connection (%v); the call can be retried on a restarted plugin", ErrPluginExited, st.Message())
		case crashNotCommitted:
			e.Code = backend.CodeUnknown
			e.Err = fmt.Errorf("%w during the write, before its commit frame: nothing was published; the write is not replayed: %v", ErrPluginExited, st.Message())
		case crashAmbiguous:
			e.Code = backend.CodeUnknown
			e.Err = fmt.Errorf("%w after the write's commit frame was sent: the object may or may not have been published: %v", ErrPluginExited, st.Message())
		}
		return e
	}
	return &CallError{Plugin: p.Name, Op: op, Code: backend.CodeUnknown, Err: err}
}

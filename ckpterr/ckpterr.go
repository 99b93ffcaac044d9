// Package ckpterr is ckptkit's one error taxonomy. Every exported sentinel of
// every package is made with New and so belongs to exactly one Class; callers
// test a class with errors.Is against the class's error (ErrBadCheckpoint,
// ErrNotFound, ...) or read it with ClassOf, and never by string matching.
// The CLI maps classes to exit codes, the plugin protocol and the C ABI carry
// the class number across process and language boundaries.
//
// The class of an error chain is the class of its outermost classified error,
// so a layer that knows better reclassifies by wrapping: a data object that a
// committed checkpoint names but storage does not have is a bad checkpoint,
// not a "not found", once the loader has wrapped it with its own sentinel.
// A cancelled context always wins: an interrupted command is Canceled,
// whatever its last I/O error said.
package ckpterr

import (
	"context"
	"errors"
)

// Class is a kind of failure that decides what a caller does next. Its
// numbers are stable: they are the exit-code basis of the CLI and the error
// classes of the C ABI and the plugin protocol.
type Class int

// The classes. Internal is an error nobody classified: a bug or an
// unexpected failure of the machine.
const (
	Internal      Class = 0 // unclassified
	BadCheckpoint Class = 1 // corrupt, incomplete, or not matching what is loaded into it
	Usage         Class = 2 // invalid arguments, options, keys, URLs or plans
	NotFound      Class = 3 // the object, path or checkpoint does not exist
	Access        Class = 4 // the credentials do not allow it
	Transient     Class = 5 // a storage failure that may succeed later
	Conflict      Class = 6 // something already exists or another writer won
	Unsupported   Class = 7 // the backend, format or dtype cannot do it
	Canceled      Class = 8 // the context was cancelled or the process interrupted
)

// Classes lists every class in number order.
var Classes = []Class{Internal, BadCheckpoint, Usage, NotFound, Access, Transient, Conflict, Unsupported, Canceled}

// String names the class as it appears in JSON output and logs.
func (c Class) String() string {
	switch c {
	case BadCheckpoint:
		return "bad-checkpoint"
	case Usage:
		return "usage"
	case NotFound:
		return "not-found"
	case Access:
		return "access"
	case Transient:
		return "transient"
	case Conflict:
		return "conflict"
	case Unsupported:
		return "unsupported"
	case Canceled:
		return "canceled"
	}
	return "internal"
}

// classError is the error value of a class: what errors.Is compares with.
type classError struct{ c Class }

func (e *classError) Error() string { return e.c.String() }

// The class errors. errors.Is(err, ErrBadCheckpoint) holds for every error
// whose chain holds a sentinel of that class.
var (
	ErrInternal      error = &classError{Internal}
	ErrBadCheckpoint error = &classError{BadCheckpoint}
	ErrUsage         error = &classError{Usage}
	ErrNotFound      error = &classError{NotFound}
	ErrAccess        error = &classError{Access}
	ErrTransient     error = &classError{Transient}
	ErrConflict      error = &classError{Conflict}
	ErrUnsupported   error = &classError{Unsupported}
	ErrCanceled      error = &classError{Canceled}
)

// Err returns the class error of c (ErrInternal for an unknown number).
func (c Class) Err() error {
	if c >= 0 && int(c) < len(Classes) {
		return classErrs[c]
	}
	return ErrInternal
}

var classErrs = []error{ErrInternal, ErrBadCheckpoint, ErrUsage, ErrNotFound, ErrAccess, ErrTransient, ErrConflict, ErrUnsupported, ErrCanceled}

// Sentinel is an exported error value of some package, tagged with its
// class. Compare it with errors.Is as usual; it also matches its class error.
type Sentinel struct {
	class Class
	msg   string
}

// New returns a sentinel of class c with message msg. Every exported error
// variable in ckptkit is made this way.
func New(c Class, msg string) *Sentinel { return &Sentinel{class: c, msg: msg} }

// Error returns the message.
func (s *Sentinel) Error() string { return s.msg }

// Class returns the sentinel's class.
func (s *Sentinel) Class() Class { return s.class }

// Is reports whether target is s's class error, so that
// errors.Is(err, ckpterr.ErrBadCheckpoint) holds for s and what wraps it.
func (s *Sentinel) Is(target error) bool {
	ce, ok := target.(*classError)
	return ok && ce.c == s.class
}

// classed is what ClassOf looks for: a sentinel, or any error type that
// knows its class (backend.Error, a plugin's remote error, ...). A Class of
// Internal means "not classified here": ClassOf looks further in.
type classed interface {
	error
	Class() Class
}

// reclassified is an error wrapped with a new class by WithClass.
type reclassified struct {
	class Class
	err   error
}

func (r *reclassified) Error() string { return r.err.Error() }
func (r *reclassified) Unwrap() error { return r.err }
func (r *reclassified) Class() Class  { return r.class }
func (r *reclassified) Is(target error) bool {
	ce, ok := target.(*classError)
	return ok && ce.c == r.class
}

// WithClass returns err reclassified as c (its message and chain unchanged),
// for a layer that knows better than the error's origin: a remote error whose
// class arrived as a number, say. It returns nil for a nil err.
func WithClass(err error, c Class) error {
	if err == nil {
		return nil
	}
	return &reclassified{class: c, err: err}
}

// ClassOf returns the class of err: Canceled when the chain holds
// context.Canceled, else the class of its outermost classified error (an
// error with a Class method, or one whose Is method matches a class error),
// else Transient for a context deadline (a timeout may pass on a retry), else
// Internal. ClassOf(nil) is Internal.
func ClassOf(err error) Class {
	if err == nil {
		return Internal
	}
	if errors.Is(err, context.Canceled) {
		return Canceled
	}
	if c, ok := outermost(err); ok {
		return c
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Transient
	}
	return Internal
}

// outermost walks err's tree depth first, outside in, and returns the first
// class it finds.
func outermost(err error) (Class, bool) {
	for err != nil {
		if c, ok := err.(classed); ok && c.Class() != Internal {
			return c.Class(), true
		}
		if m, ok := err.(interface{ Is(error) bool }); ok {
			for _, c := range Classes[1:] {
				if m.Is(c.Err()) {
					return c, true
				}
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if c, ok := outermost(e); ok {
					return c, true
				}
			}
			return Internal, false
		default:
			return Internal, false
		}
	}
	return Internal, false
}

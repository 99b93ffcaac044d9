package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// RemoteError is an error in a form that crosses machines: its message and
// the codes of the registered sentinels it matched where it was made. On the
// receiving side errors.Is(remote, sentinel) is true for those sentinels, so
// a classification such as planner.ErrPlanMismatch survives the trip; errors.As
// to a concrete error type does not (only the message is kept).
//
// Values exchanged by a cross-machine coordinator carry errors as
// *RemoteError (see ToRemote and FromRemote); the in-process Local
// coordinator passes values by reference and needs none of this.
type RemoteError struct {
	// Message is the original error's Error().
	Message string
	// Codes name the registered sentinels the original error matched.
	Codes []string
	// ErrClass is the original error's ckpterr class, so that the CLI's exit
	// code and every errors.Is(err, ckpterr.ErrX) test survive the trip
	// even for sentinels nobody registered.
	ErrClass ckpterr.Class
}

// Class returns the original error's ckpterr class.
func (e *RemoteError) Class() ckpterr.Class { return e.ErrClass }

// Error returns the original message.
func (e *RemoteError) Error() string { return e.Message }

// Is reports whether target is the sentinel of one of e's codes or the
// class error of e's class.
func (e *RemoteError) Is(target error) bool {
	if e.ErrClass != ckpterr.Internal && target == e.ErrClass.Err() {
		return true
	}
	for _, c := range e.Codes {
		regMu.RLock()
		s, ok := regByCode[c]
		regMu.RUnlock()
		if ok && s == target {
			return true
		}
	}
	return false
}

type sentinel struct {
	code string
	err  error
}

var (
	regMu     sync.RWMutex
	registry  []sentinel
	regByCode = map[string]error{}
)

// RegisterError makes sentinel err travel across machines under code: an
// error that matches err (errors.Is) is sent with code, and the received
// *RemoteError matches err again. Packages register their sentinels once,
// in an init function; every process of a group must register the same
// ones. Registering a code twice with another error panics.
func RegisterError(code string, err error) {
	regMu.Lock()
	defer regMu.Unlock()
	if old, ok := regByCode[code]; ok {
		if old != err {
			panic(fmt.Sprintf("coordinator: error code %q registered twice", code))
		}
		return
	}
	regByCode[code] = err
	registry = append(registry, sentinel{code: code, err: err})
}

func init() {
	RegisterError("coordinator.ErrAborted", ErrAborted)
	RegisterError("context.Canceled", context.Canceled)
	RegisterError("context.DeadlineExceeded", context.DeadlineExceeded)
	for _, s := range []struct {
		code string
		err  error
	}{
		{"backend.ErrNotFound", backend.ErrNotFound},
		{"backend.ErrAlreadyExists", backend.ErrAlreadyExists},
		{"backend.ErrPermission", backend.ErrPermission},
		{"backend.ErrUnsupported", backend.ErrUnsupported},
		{"backend.ErrInvalidKey", backend.ErrInvalidKey},
		{"backend.ErrSizeMismatch", backend.ErrSizeMismatch},
		{"backend.ErrTransient", backend.ErrTransient},
	} {
		RegisterError(s.code, s.err)
	}
}

// ToRemote returns err's wire form (nil for nil): its message and the codes
// of every registered sentinel it matches.
func ToRemote(err error) *RemoteError {
	if err == nil {
		return nil
	}
	regMu.RLock()
	reg := registry[:len(registry):len(registry)]
	regMu.RUnlock()
	re := &RemoteError{Message: err.Error(), ErrClass: ckpterr.ClassOf(err)}
	for _, s := range reg {
		if errors.Is(err, s.err) {
			re.Codes = append(re.Codes, s.code)
		}
	}
	return re
}

// FromRemote returns e as an error, and a nil error (not a nil pointer in
// an interface) for nil.
func FromRemote(e *RemoteError) error {
	if e == nil {
		return nil
	}
	return e
}

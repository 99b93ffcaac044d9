package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// envTestPanic, set in the environment passed to an open, makes the open
// panic inside its export (tests: a Go panic must surface as an internal
// error, never abort the process).
const envTestPanic = "CKPTKIT_TEST_PANIC"

// guard runs the body of the export name: its error, or a panic recovered
// into an internal error (the panic value and the stack go to the log),
// becomes the export's -1 and out parameters.
func guard(name string, cls *C.int, rule, msg **C.char, body func() error) C.int {
	if err := protect(name, body); err != nil {
		return fail(err, cls, rule, msg)
	}
	return 0
}

// protect runs body, recovering a panic into an internal error.
func protect(name string, body func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = panicError(name, p)
		}
	}()
	return body()
}

// panicError logs a panic recovered in export name, with its stack, and
// returns it as an internal error.
func panicError(name string, p any) error {
	slog.Error("ckptkit: panic in the Go core (a bug, please report it)", "call", name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return ckpterr.WithClass(fmt.Errorf("%s: internal error (a bug, please report it; the stack is in the log): panic: %v", name, p), ckpterr.Internal)
}

// recoverQuiet, deferred by an export without error out parameters,
// recovers a panic: it is logged and onPanic sets the export's result.
func recoverQuiet(name string, onPanic func()) {
	if p := recover(); p != nil {
		_ = panicError(name, p)
		onPanic()
	}
}

// cancelToken is what a cancellation token handle refers to: the context
// the calls made with the token run under.
type cancelToken struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// withCall runs f under the context of token tok (0: none) carrying the
// environment env (a JSON object of variables; NULL or "" for the
// process's own: backend.WithEnv).
func withCall(tok C.uintptr_t, env *C.char, f func(ctx context.Context) error) error {
	ctx := context.Background()
	if tok != 0 {
		t, release, err := acquire[*cancelToken](&handles, uint64(tok), "cancellation token")
		if err != nil {
			return err
		}
		defer release()
		ctx = t.ctx
	}
	m, err := envOf(env)
	if err != nil {
		return err
	}
	if m != nil {
		ctx = backend.WithEnv(ctx, m)
		if m[envTestPanic] != "" {
			panic("forced by " + envTestPanic)
		}
	}
	return f(ctx)
}

// envOf decodes the environment passed to a call (nil for none).
func envOf(env *C.char) (map[string]string, error) {
	if env == nil {
		return nil, nil
	}
	s := C.GoString(env)
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("%w: environment: %v", errUsage, err)
	}
	return m, nil
}

// withStore runs f on the store of handle h (a store, or a checkpoint
// serving store calls on its prefix), holding a reference on h meanwhile.
func withStore(h C.uintptr_t, f func(sh *storeHandle) error) error {
	v, release, err := acquire[any](&handles, uint64(h), "store")
	if err != nil {
		return err
	}
	defer release()
	switch v := v.(type) {
	case *storeHandle:
		return f(v)
	case *ckptHandle:
		return f(&v.storeHandle)
	}
	return fmt.Errorf("%w: handle %#x is not a store", errUsage, uint64(h))
}

// storeCall is withStore under the context of token tok.
func storeCall(tok, h C.uintptr_t, f func(ctx context.Context, sh *storeHandle) error) error {
	return withCall(tok, nil, func(ctx context.Context) error {
		return withStore(h, func(sh *storeHandle) error { return f(ctx, sh) })
	})
}

// withHandle runs f on what handle h refers to, when it is a T, holding a
// reference on h meanwhile.
func withHandle[T any](h C.uintptr_t, what string, f func(v T) error) error {
	v, release, err := acquire[T](&handles, uint64(h), what)
	if err != nil {
		return err
	}
	defer release()
	return f(v)
}

// setJSON stores v as a C string of JSON in *out.
func setJSON(out **C.char, v any) error {
	s, err := cjson(v)
	if err != nil {
		return err
	}
	*out = s
	return nil
}

// ckpt_cancel_new returns a new cancellation token (0 if it could not be
// made): the calls made with it stop, with a Canceled error, once
// ckpt_cancel is called on it. Release it with ckpt_cancel_free.
//
//export ckpt_cancel_new
func ckpt_cancel_new() (out C.uintptr_t) {
	defer recoverQuiet("ckpt_cancel_new", func() { out = 0 })
	ctx, cancel := context.WithCancel(context.Background())
	return C.uintptr_t(handles.add(&cancelToken{ctx: ctx, cancel: cancel}))
}

// ckpt_cancel cancels the calls made with token tok (those in flight stop
// promptly, later ones fail at once); 0 on success, -1 for an invalid
// token.
//
//export ckpt_cancel
func ckpt_cancel(tok C.uintptr_t) (rc C.int) {
	defer recoverQuiet("ckpt_cancel", func() { rc = -1 })
	if withHandle(tok, "cancellation token", func(t *cancelToken) error { t.cancel(); return nil }) != nil {
		return -1
	}
	return 0
}

// ckpt_cancel_free releases token tok once the calls made with it have
// returned (0 on success, -1 for an invalid token).
//
//export ckpt_cancel_free
func ckpt_cancel_free(tok C.uintptr_t) (rc C.int) {
	defer recoverQuiet("ckpt_cancel_free", func() { rc = -1 })
	t, err := remove[*cancelToken](&handles, uint64(tok), "cancellation token")
	if err != nil {
		return -1
	}
	t.cancel()
	return 0
}

// ckpt_handles returns the number of live handles of every kind (leak
// tests: it must come back to where it was once everything is closed).
//
//export ckpt_handles
func ckpt_handles() C.int64_t { return C.int64_t(handles.live()) }

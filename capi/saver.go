package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// The asynchronous saves of the C ABI are saver.Saver's, as they are: a
// saver handle owns one saver.Saver (its staging pool, its one save in
// flight, its pending failure); a save handle is one saver.Handle. Nothing
// of the staging is done here: the caller's buffers are read until the
// state is staged, which is when ckpt_saver_save returns, or (a saver
// opened with overlap) when ckpt_save_wait_staged says so: the caller
// keeps them alive and unchanged until then.

// saverHandle is what a saver handle refers to.
type saverHandle struct {
	sv *saver.Saver
	// mu guards cancel, which aborts the newest save (ckpt_saver_cancel).
	mu     sync.Mutex
	cancel context.CancelFunc
}

// saveHandle is one asynchronous save: the saver's handle and the stores
// and coordinator the save uses, released once it ends (done is closed
// after that).
type saveHandle struct {
	h    *saver.Handle
	url  string
	done chan struct{}
	// cleanupErr is a failure to release the coordinator (rank 0 waits for
	// the other ranks and removes the group's objects); the checkpoint's
	// outcome is h's.
	cleanupErr error
}

// saveSpec is the JSON a caller passes to ckpt_saver_save: one rank's
// state (tensors in C buffers, byte values inline), the options of
// saver.Options, and for a multi-process save the store coordinator all
// ranks share.
type saveSpec struct {
	// Tensors are read from the buffers passed to ckpt_saver_save until
	// it returns.
	Tensors []tensorSpec `json:"tensors"`
	// Bytes are the byte values by key (base64 in the JSON).
	Bytes map[string][]byte `json:"bytes"`

	Iteration       int64    `json:"iteration"`
	NoSaveOptimizer bool     `json:"no_save_optimizer"`
	ModelPrefix     string   `json:"model_prefix"`
	OptimizerPrefix string   `json:"optimizer_prefix"`
	OptimizerSlots  []string `json:"optimizer_slots"`
	Params          []string `json:"params"`
	Overwrite       bool     `json:"overwrite"`
	MaxObjectBytes  int64    `json:"max_object_bytes"`
	Concurrency     int      `json:"concurrency"`

	// Coordinator, when set, makes the save one rank's part of a
	// collective save of World ranks (processes) coordinated through
	// objects under URL (coordinator.NewStore), in the session Group that
	// every rank passes and no other save uses.
	Coordinator *struct {
		URL   string `json:"url"`
		Group string `json:"group"`
		Rank  int    `json:"rank"`
		World int    `json:"world"`
	} `json:"coordinator"`
}

// stateDict builds the rank's state over the C buffers (no copy).
func (sp *saveSpec) stateDict(ptrs []unsafe.Pointer) (*statedict.StateDict, error) {
	sd := statedict.New()
	for _, ts := range sp.Tensors {
		sh, err := ts.shard(ptrs)
		if err != nil {
			return nil, err
		}
		sd.Tensors[ts.Key] = sh
	}
	for k, v := range sp.Bytes {
		if v == nil {
			v = []byte{}
		}
		sd.Bytes[k] = v
	}
	return sd, nil
}

func (sp *saveSpec) options() saver.Options {
	return saver.Options{Iteration: sp.Iteration, NoSaveOptimizer: sp.NoSaveOptimizer, ModelPrefix: sp.ModelPrefix,
		OptimizerPrefix: sp.OptimizerPrefix, OptimizerSlots: sp.OptimizerSlots, Params: sp.Params, Overwrite: sp.Overwrite,
		MaxObjectBytes: sp.MaxObjectBytes, Concurrency: sp.Concurrency}
}

// ckpt_saver_new creates an asynchronous saver (saver.NewSaver) whose
// staging never holds more than staging_bytes (0: saver.DefaultStagingBytes,
// at least saver.MinStagingBytes). Keep one per process for the whole run.
//
//export ckpt_saver_new
func ckpt_saver_new(stagingBytes C.int64_t, out *C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_new", cls, rule, msg, func() error {
		sv, err := saver.NewSaver(saver.AsyncOptions{StagingBytes: int64(stagingBytes)})
		if err != nil {
			return err
		}
		*out = C.uintptr_t(handles.add(&saverHandle{sv: sv}))
		return nil
	})
}

// saverOptions is the JSON a caller passes to ckpt_saver_open
// (saver.AsyncOptions).
type saverOptions struct {
	// StagingBytes is the staging budget (0: saver.DefaultStagingBytes).
	StagingBytes int64 `json:"staging_bytes"`
	// Overlap makes ckpt_saver_save return once the save is planned; the
	// caller waits for ckpt_save_wait_staged before it changes or frees
	// the buffers it passed.
	Overlap bool `json:"overlap"`
	// Prefault maps and touches the whole pool now.
	Prefault bool `json:"prefault"`
}

// ckpt_saver_open creates an asynchronous saver (saver.NewSaver) with the
// options of the JSON object options (see saverOptions; NULL or "" for the
// defaults, unknown fields refused): its staging budget, whether saves
// return once planned (overlap) and whether the pool is faulted in now
// (prefault). Keep one per process for the whole run.
//
//export ckpt_saver_open
func ckpt_saver_open(options *C.char, out *C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_open", cls, rule, msg, func() error {
		var o saverOptions
		if options != nil && C.GoString(options) != "" {
			dec := json.NewDecoder(strings.NewReader(C.GoString(options)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&o); err != nil {
				return fmt.Errorf("%w: saver options: %v", errUsage, err)
			}
		}
		sv, err := saver.NewSaver(saver.AsyncOptions{StagingBytes: o.StagingBytes, Overlap: o.Overlap, Prefault: o.Prefault})
		if err != nil {
			return err
		}
		*out = C.uintptr_t(handles.add(&saverHandle{sv: sv}))
		return nil
	})
}

// ckpt_saver_default_staging_bytes is saver.DefaultStagingBytes.
//
//export ckpt_saver_default_staging_bytes
func ckpt_saver_default_staging_bytes() C.int64_t { return saver.DefaultStagingBytes }

// ckpt_saver_save starts an asynchronous save of one rank's state (spec,
// JSON: see saveSpec; the tensors in the nbufs C buffers bufs) to the
// checkpoint at url and returns once the state is staged: from then on the
// caller may change its buffers. With a saver opened with overlap it
// returns once the save is planned, and the buffers are read until
// ckpt_save_wait_staged reports the state staged. It first waits for the saver's save in
// flight; if that one failed and no call reported it yet, this call fails
// with that error instead of starting (saver.Saver's rule). A save that
// fails before it is staged (overlap: before it is planned) fails here. *out receives the save handle
// (release it with ckpt_save_release).
//
//export ckpt_saver_save
func ckpt_saver_save(tok, h C.uintptr_t, url, env, spec *C.char, bufs *unsafe.Pointer, nbufs C.int, out *C.uintptr_t,
	cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_save", cls, rule, msg, func() error {
		return withCall(tok, env, func(ctx context.Context) error {
			return withHandle(h, "saver", func(svh *saverHandle) error {
				var sp saveSpec
				if err := json.Unmarshal([]byte(C.GoString(spec)), &sp); err != nil {
					return fmt.Errorf("%w: save spec: %v", errUsage, err)
				}
				var ptrs []unsafe.Pointer
				if nbufs > 0 {
					ptrs = unsafe.Slice(bufs, int(nbufs))
				}
				sd, err := sp.stateDict(ptrs)
				if err != nil {
					return err
				}
				sh, err := startSave(ctx, svh, C.GoString(url), &sp, sd)
				if err != nil {
					return err
				}
				*out = C.uintptr_t(handles.add(sh))
				return nil
			})
		})
	})
}

// startSave opens the stores (and coordinator) of one save and starts it;
// they are released by a goroutine once the save ends. The save runs under
// a context of its own (with the environment of callCtx): cancelling
// callCtx aborts it until the state is staged and the call returns;
// after that only ckpt_saver_cancel does.
func startSave(callCtx context.Context, svh *saverHandle, url string, sp *saveSpec, sd *statedict.StateDict) (*saveHandle, error) {
	sv := svh.sv
	ctx, cancel := context.WithCancel(context.WithoutCancel(callCtx))
	stop := context.AfterFunc(callCtx, cancel)
	defer stop()
	started := false
	defer func() {
		if !started {
			cancel() // the save never started: nothing else ends its context
		}
	}()
	sh, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	var (
		coord  coordinator.Coordinator
		cst    *storeHandle
		closer func(context.Context) error
	)
	if c := sp.Coordinator; c != nil && c.World > 1 {
		if cst, err = openStore(ctx, c.URL); err != nil {
			_ = closeStore(sh)
			return nil, fmt.Errorf("save %s: coordination store: %w", sh.st, err)
		}
		sc, err := coordinator.NewStore(cst.st, c.Group, c.Rank, c.World, coordinator.StoreOptions{})
		if err != nil {
			_ = closeStore(sh)
			_ = closeStore(cst)
			return nil, ckpterr.WithClass(fmt.Errorf("save %s: %w", sh.st, err), ckpterr.Usage)
		}
		coord, closer = sc, sc.Close
	}
	opts := sp.options()
	// ckpt_saver_cancel aborts this save from now on; a save refused below
	// (or waiting for the previous one) hands it back to the previous one.
	svh.mu.Lock()
	prevCancel := svh.cancel
	svh.cancel = cancel
	svh.mu.Unlock()
	var h *saver.Handle
	if coord != nil {
		h, err = sv.SaveAsync(ctx, sh.st, coord, sd, opts)
	} else {
		h, err = sv.SaveLocalAsync(ctx, sh.st, []*statedict.StateDict{sd}, opts)
	}
	release := func(s *saveHandle) {
		if closer != nil {
			// Not under ctx: an aborted save still removes its group.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			err := closer(cctx)
			cancel()
			if s != nil {
				s.cleanupErr = err
			}
		}
		if cst != nil {
			_ = closeStore(cst)
		}
		_ = closeStore(sh)
		cancel()
	}
	if h == nil {
		// Refused before it started (the previous save's failure, a
		// canceled wait): nothing runs in the background.
		svh.mu.Lock()
		svh.cancel = prevCancel
		svh.mu.Unlock()
		release(nil)
		return nil, err
	}
	started = true
	s := &saveHandle{h: h, url: sh.st.String(), done: make(chan struct{})}
	go func() {
		<-h.Done()
		release(s)
		close(s.done)
	}()
	if err != nil {
		// Failed before it was staged; the handle is final.
		return nil, err
	}
	return s, nil
}

// ckpt_save_state sets *state to where a save stands: 0 staging, 1 staged
// (being written), 2 committed, 3 failed.
//
//export ckpt_save_state
func ckpt_save_state(h C.uintptr_t, state *C.int, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_save_state", cls, rule, msg, func() error {
		return withHandle(h, "save", func(s *saveHandle) error { *state = C.int(s.h.State()); return nil })
	})
}

// ckpt_save_wait waits at most timeout_ms milliseconds (< 0: without limit)
// for the save to end. *done is 0 when the time ran out (the call then
// succeeds); otherwise the call returns the save's outcome: 0 with *result
// (JSON, see saveResult) when it committed, or -1 with its error. Waiting
// does not consume the failure: the saver's next save still reports it.
//
//export ckpt_save_wait
func ckpt_save_wait(tok, h C.uintptr_t, timeoutMs C.int64_t, done *C.int, result **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_save_wait", cls, rule, msg, func() error {
		return withCall(tok, nil, func(ctx context.Context) error {
			return withHandle(h, "save", func(s *saveHandle) error {
				*done = 0
				var timeout <-chan time.Time
				if timeoutMs >= 0 {
					t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
					defer t.Stop()
					timeout = t.C
				}
				select {
				case <-s.done:
				case <-timeout:
					return nil
				case <-ctx.Done():
					return ckpterr.WithClass(fmt.Errorf("wait for the save to %s: %w", s.url, ctx.Err()), ckpterr.Canceled)
				}
				*done = 1
				res, err := s.h.Wait(ctx)
				if err != nil {
					return err
				}
				out := saveResult{URL: res.URL, BytesWritten: res.BytesWritten, MetadataBytes: res.MetadataBytes,
					Seconds: s.h.Elapsed().Seconds(), StallSeconds: s.h.Stall().Seconds(), WaitedSeconds: s.h.Waited().Seconds(),
					StagingSeconds: s.h.Staging().Seconds()}
				if s.cleanupErr != nil {
					out.Warning = s.cleanupErr.Error()
				}
				return setJSON(result, out)
			})
		})
	})
}

// ckpt_save_wait_staged waits at most timeout_ms milliseconds (< 0:
// without limit) until the save no longer reads the caller's buffers
// (saver.Handle.WaitStaged): *done is 1 once it does, 0 when the time ran
// out. It also returns once a save fails while staging; whether the save
// succeeds is ckpt_save_wait's answer. Cancelling tok stops the wait (class
// canceled), not the save.
//
//export ckpt_save_wait_staged
func ckpt_save_wait_staged(tok, h C.uintptr_t, timeoutMs C.int64_t, done *C.int, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_save_wait_staged", cls, rule, msg, func() error {
		return withCall(tok, nil, func(ctx context.Context) error {
			return withHandle(h, "save", func(s *saveHandle) error {
				*done = 0
				if timeoutMs >= 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeoutCause(ctx, time.Duration(timeoutMs)*time.Millisecond, errStagedTimeout)
					defer cancel()
				}
				if err := s.h.WaitStaged(ctx); err != nil {
					if context.Cause(ctx) == errStagedTimeout {
						return nil
					}
					return ckpterr.WithClass(fmt.Errorf("wait for the save to %s to be staged: %w", s.url, err), ckpterr.Canceled)
				}
				*done = 1
				return nil
			})
		})
	})
}

// errStagedTimeout ends a ckpt_save_wait_staged whose time ran out.
var errStagedTimeout = errors.New("the time to wait for staging ran out")

// ckpt_save_release releases a save handle (the save itself goes on if it
// is still running).
//
//export ckpt_save_release
func ckpt_save_release(h C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_save_release", cls, rule, msg, func() error {
		_, err := remove[*saveHandle](&handles, uint64(h), "save")
		return err
	})
}

// ckpt_saver_cancel aborts the saver's newest save if it is still running:
// it fails with a Canceled error and commits nothing. A job interrupted by Ctrl-C calls it at exit instead of waiting.
//
//export ckpt_saver_cancel
func ckpt_saver_cancel(h C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_cancel", cls, rule, msg, func() error {
		return withHandle(h, "saver", func(svh *saverHandle) error {
			svh.mu.Lock()
			defer svh.mu.Unlock()
			if svh.cancel != nil {
				svh.cancel()
			}
			return nil
		})
	})
}

// ckpt_saver_stats returns the saver's staging figures (saver.Stats) as
// JSON {budget_bytes, pool_bytes, held_bytes, peak_bytes}.
//
//export ckpt_saver_stats
func ckpt_saver_stats(h C.uintptr_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_stats", cls, rule, msg, func() error {
		return withHandle(h, "saver", func(svh *saverHandle) error { return setJSON(out, saverStatsOf(svh.sv.Stats())) })
	})
}

// ckpt_saver_idle waits for the saver's save in flight and fails with its
// error if it failed and no call reported that yet. A synchronous save calls
// it first, so it never overlaps an asynchronous one and a background
// failure is reported by it too. The staging pool is kept for the next save,
// unless the save failed. With close set the saver handle is released as
// well (saver.Saver.Close: the pool too).
//
//export ckpt_saver_idle
func ckpt_saver_idle(tok, h C.uintptr_t, closeIt C.int, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_saver_idle", cls, rule, msg, func() error {
		return withCall(tok, nil, func(ctx context.Context) error {
			var svh *saverHandle
			if closeIt != 0 {
				v, err := remove[*saverHandle](&handles, uint64(h), "saver")
				if err != nil {
					return err
				}
				svh = v
			} else {
				v, release, err := acquire[*saverHandle](&handles, uint64(h), "saver")
				if err != nil {
					return err
				}
				defer release()
				if _, err := v.sv.Wait(ctx); err == nil {
					return nil // the newest save committed: nothing to report
				} else if ctx.Err() != nil {
					return ckpterr.WithClass(fmt.Errorf("wait for the save in flight: %w", err), ckpterr.Canceled)
				}
				svh = v
			}
			// Close reports the failure only if no save call returned it yet.
			return svh.sv.Close(ctx)
		})
	})
}

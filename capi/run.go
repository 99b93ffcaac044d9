package main

/*
#include <stdint.h>
#include <stdlib.h>

// ckpt_load_fn loads the checkpoint a resume chose (handle h, described by
// the JSON info) into the caller's targets: 0 on success, non-zero on
// failure (the handle says why: its last ckpt_checkpoint_load's error, or
// the one ckpt_checkpoint_fail reported).
typedef int (*ckpt_load_fn)(uintptr_t h, const char *info);

static inline int ckpt_call_load(ckpt_load_fn f, uintptr_t h, const char *info) { return f(h, info); }
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/loader"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// runLayout is a run's layout as package run owns it, for a caller that
// must not rebuild it (Python's save and resume).
type runLayout struct {
	// StepName and StepURL name step's checkpoint under the run.
	StepName string `json:"step_name"`
	StepURL  string `json:"step_url"`
	// CoordURL is where ranks coordinating through the store keep their
	// rounds (run.CoordPrefix under the run).
	CoordURL string `json:"coord_url"`
}

// ckpt_run_layout writes to *out the JSON {step_name, step_url, coord_url}
// of step (>= 0) under the run URL url, its query kept.
//
//export ckpt_run_layout
func ckpt_run_layout(url *C.char, step C.int64_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_run_layout", cls, rule, msg, func() error {
		if step < 0 {
			return fmt.Errorf("%w: step %d is negative", errUsage, int64(step))
		}
		u, name := C.GoString(url), catalog.StepName(int64(step))
		return setJSON(out, runLayout{StepName: name, StepURL: ckrun.URLIn(u, name), CoordURL: ckrun.URLIn(u, ckrun.CoordPrefix)})
	})
}

// resumeSpec is the JSON a caller passes to ckpt_run_resume.
type resumeSpec struct {
	// AllowFresh lets a URL under which nothing is stored start fresh
	// (run.ResumeOptions.AllowFresh).
	AllowFresh bool `json:"allow_fresh"`
	// Coordinator, with World > 1, makes the ranks agree through the store
	// coordinator under the (durable) run: every rank calls with the same
	// Group, unique per resume.
	Coordinator *struct {
		Group string `json:"group"`
		Rank  int    `json:"rank"`
		World int    `json:"world"`
	} `json:"coordinator"`
	// Local is this rank's node-local tier (run.Tiered.ResumeTiered);
	// empty: the URL alone.
	Local string `json:"local"`
}

// loadInfo describes the checkpoint handed to the load callback.
type loadInfo struct {
	URL       string `json:"url"`
	Name      string `json:"name"`
	Step      int64  `json:"step"`
	Format    string `json:"format"`
	Iteration int64  `json:"iteration"`
	Optimizer string `json:"optimizer"`
	// OnePass: the load may be followed by another (a fallback, the ranks
	// agreeing on an older step), so it loads in one pass
	// (loadSpec.OnePass); false for a checkpoint URL, loaded
	// transactionally.
	OnePass bool `json:"one_pass"`
}

// resumeSkip is a checkpoint a resume passed over.
type resumeSkip struct {
	URL    string `json:"url"`
	Reason string `json:"reason"`
	Why    string `json:"why"`
}

// resumeResult is ckpt_run_resume's JSON.
type resumeResult struct {
	Fresh bool `json:"fresh"`
	Empty bool `json:"empty"`
	// URL is the URL resumed (the checkpoint loaded, or the run when
	// Fresh).
	URL       string       `json:"url"`
	Name      string       `json:"name"`
	Step      int64        `json:"step"`
	Iteration int64        `json:"iteration"`
	Skipped   []resumeSkip `json:"skipped"`
	// Tier is "local" or "durable" (Local only; "" when Fresh), TierWhy
	// why.
	Tier    string `json:"tier"`
	TierWhy string `json:"tier_why"`
}

// ckpt_run_resume resumes from url (run.ResumeURL: a checkpoint's URL
// loaded as it is, or a run's newest valid step, falling back past damaged
// data, never restarting silently) or, with spec's local, from the nearest
// valid tier (run.Tiered.ResumeTiered). Every choice, fallback and
// cross-rank agreement is the run package's; load is called (on the
// calling thread) for each checkpoint to load, with a checkpoint handle
// valid during the call. *out receives the JSON result {fresh, empty, url,
// name, step, iteration, skipped [{url, reason, why}], tier, tier_why}.
//
//export ckpt_run_resume
func ckpt_run_resume(tok C.uintptr_t, url, env, spec *C.char, load C.ckpt_load_fn, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_run_resume", cls, rule, msg, func() error {
		var rs resumeSpec
		if err := json.Unmarshal([]byte(C.GoString(spec)), &rs); err != nil {
			return fmt.Errorf("%w: resume spec: %v", errUsage, err)
		}
		if load == nil {
			return fmt.Errorf("%w: no load function", errUsage)
		}
		envMap, err := envOf(env)
		if err != nil {
			return err
		}
		return withCall(tok, env, func(ctx context.Context) error {
			res, err := resumeURL(ctx, C.GoString(url), envMap, rs, load)
			if err != nil {
				return err
			}
			return setJSON(out, res)
		})
	})
}

func resumeURL(ctx context.Context, url string, env map[string]string, rs resumeSpec, load C.ckpt_load_fn) (*resumeResult, error) {
	sh, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = closeStore(sh) }()
	opts := ckrun.ResumeOptions{AllowFresh: rs.AllowFresh, Load: callbackLoad(env, load, sh.st.String())}
	if c := rs.Coordinator; c != nil && c.World > 1 {
		sc, err := ckrun.New(sh.st).NewCoordinator(c.Group, c.Rank, c.World, coordinator.StoreOptions{})
		if err != nil {
			return nil, err
		}
		defer func() { _ = sc.Close(ctx) }()
		opts.Coordinator = sc
	}
	var res *ckrun.Resumed
	tier, why := "", ""
	if rs.Local == "" {
		// A checkpoint's URL is loaded as it is; OnePass is decided per
		// load from whether a choice was made (callbackLoad).
		res, err = ckrun.ResumeURL(ctx, sh.st, opts)
	} else {
		var lh *storeHandle
		if lh, err = openStore(ctx, rs.Local); err != nil {
			return nil, err
		}
		defer func() { _ = closeStore(lh) }()
		tr := ckrun.NewTiered(ckrun.New(lh.st), ckrun.New(sh.st), ckrun.TierOptions{NoPersist: true})
		var tres *ckrun.TierResumed
		tres, err = tr.ResumeTiered(ctx, opts)
		_ = tr.Close(0)
		if tres != nil {
			res, tier, why = tres.Resumed, tres.Tier, tres.Why
		}
	}
	if err != nil {
		return nil, err
	}
	out := &resumeResult{Fresh: res.Fresh, Empty: res.Empty, URL: sh.st.String(), Name: res.Entry.Name, Step: res.Entry.Step,
		Skipped: []resumeSkip{}, Tier: tier, TierWhy: why}
	if res.Checkpoint != nil {
		out.URL, out.Iteration = res.Checkpoint.URL(), res.Checkpoint.Metadata().Training.Iteration
	}
	for _, s := range res.Skipped {
		out.Skipped = append(out.Skipped, resumeSkip{URL: s.Entry.URL, Reason: s.Reason, Why: s.Why.String()})
	}
	return out, nil
}

// callbackLoad is the run.LoadFunc that lends each checkpoint to load (a
// borrowed handle, removed when load returns) and takes its outcome from
// the handle. The checkpoint at the URL resumed (resumed: no choice, no
// fallback) is loaded transactionally, a step chosen from a run in one
// pass.
func callbackLoad(env map[string]string, load C.ckpt_load_fn, resumed string) ckrun.LoadFunc {
	return func(ctx context.Context, c *loader.Checkpoint) (*loader.Report, error) {
		md := c.Metadata()
		info := loadInfo{URL: c.URL(), Step: -1, Format: c.FormatName(), Iteration: md.Training.Iteration,
			Optimizer: string(md.Training.Optimizer), OnePass: strings.TrimSuffix(c.URL(), "/") != strings.TrimSuffix(resumed, "/")}
		if name, step, ok := ckrun.StepOf(c.URL()); ok {
			info.Name, info.Step = name, step
		}
		raw, err := json.Marshal(info)
		if err != nil {
			return nil, err
		}
		h := &ckptHandle{storeHandle: storeHandle{st: c.Store()}, ck: c, env: env, borrowed: true}
		id := handles.add(h)
		cinfo := C.CString(string(raw))
		rc := C.ckpt_call_load(load, C.uintptr_t(id), cinfo)
		C.free(unsafe.Pointer(cinfo))
		_, _ = remove[*ckptHandle](&handles, id, "checkpoint") // the callback may have closed it
		h.outcome.Lock()
		defer h.outcome.Unlock()
		switch {
		case rc == 0 && h.outcome.rep != nil:
			return h.outcome.rep, nil
		case rc == 0:
			return nil, fmt.Errorf("load %s: the load callback returned without loading it", c.URL())
		case h.outcome.reported != nil:
			return nil, h.outcome.reported
		case h.outcome.err != nil:
			return nil, h.outcome.err
		}
		return nil, fmt.Errorf("load %s: the load callback failed without saying why", c.URL())
	}
}

// ckpt_checkpoint_fail reports, from a load callback of ckpt_run_resume,
// why the caller's load of checkpoint h failed when the Go loader did not
// (a value that does not decode, a target the caller refused): class cls
// (a ckpterr class number), rule (a resume rule name, or NULL) and msg. The
// resume returns it (and tells the other ranks).
//
//export ckpt_checkpoint_fail
func ckpt_checkpoint_fail(h C.uintptr_t, fcls C.int, frule, fmsg *C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_checkpoint_fail", cls, rule, msg, func() error {
		return withHandle(h, "checkpoint", func(ch *ckptHandle) error {
			text := C.GoString(fmsg)
			var err error
			if r := goStringOrEmpty(frule); r != "" {
				err = fmt.Errorf("%s: %w", text, loader.RuleError(r))
			} else {
				err = ckpterr.WithClass(errors.New(text), ckpterr.Class(fcls))
			}
			ch.outcome.Lock()
			ch.outcome.reported = err
			ch.outcome.Unlock()
			return nil
		})
	})
}

func goStringOrEmpty(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// tierSpec is the JSON a caller passes to ckpt_tiered_open
// (run.TierOptions).
type tierSpec struct {
	PersistEvery int64 `json:"persist_every"`
	LocalKeep    int   `json:"local_keep"`
	NoPersist    bool  `json:"no_persist"`
}

// tieredHandle is an open tiered run and the stores it owns.
type tieredHandle struct {
	t              *ckrun.Tiered
	local, durable *storeHandle
	env            map[string]string
}

// ckpt_tiered_open opens the tiered run of the node-local run local and the
// durable run durable (run.NewTiered) with spec (JSON {persist_every,
// local_keep, no_persist}): ckpt_tiered_committed persists committed local
// steps in the background, ckpt_tiered_close ends it.
//
//export ckpt_tiered_open
func ckpt_tiered_open(tok C.uintptr_t, local, durable, env, spec *C.char, out *C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_tiered_open", cls, rule, msg, func() error {
		var ts tierSpec
		if err := json.Unmarshal([]byte(C.GoString(spec)), &ts); err != nil {
			return fmt.Errorf("%w: tier spec: %v", errUsage, err)
		}
		if ts.PersistEvery < 0 || ts.LocalKeep < 0 {
			return fmt.Errorf("%w: persist_every %d and local_keep %d must not be negative", errUsage, ts.PersistEvery, ts.LocalKeep)
		}
		envMap, err := envOf(env)
		if err != nil {
			return err
		}
		return withCall(tok, env, func(ctx context.Context) error {
			lh, err := openStore(ctx, C.GoString(local))
			if err != nil {
				return err
			}
			dh, err := openStore(ctx, C.GoString(durable))
			if err != nil {
				_ = closeStore(lh)
				return err
			}
			t := ckrun.NewTiered(ckrun.New(lh.st), ckrun.New(dh.st), ckrun.TierOptions{PersistEvery: ts.PersistEvery,
				LocalKeep: ts.LocalKeep, NoPersist: ts.NoPersist})
			*out = C.uintptr_t(handles.add(&tieredHandle{t: t, local: lh, durable: dh, env: envMap}))
			return nil
		})
	})
}

// persistOutcome is one ended persist as the caller sees it.
type persistOutcome struct {
	Step    int64  `json:"step"`
	Retries int    `json:"retries"`
	Bytes   int64  `json:"bytes"`
	Error   string `json:"error,omitempty"`
}

// persistsErr is the persists that ended as JSON for *out, and the first
// failure among them (wrapped: its class and rule are the call's).
func persistsErr(ended []ckrun.Persist, out **C.char) error {
	list := []persistOutcome{}
	var first error
	failed := 0
	for _, p := range ended {
		o := persistOutcome{Step: p.Step, Retries: p.Retries}
		if p.Result != nil {
			o.Bytes = p.Result.Bytes
		}
		if p.Err != nil {
			o.Error = p.Err.Error()
			failed++
			if first == nil {
				first = p.Err
			}
		}
		list = append(list, o)
	}
	if first != nil {
		return fmt.Errorf("%d persist(s) to the durable run failed: %w", failed, first)
	}
	return setJSON(out, list)
}

// ckpt_tiered_committed tells the tiered run h that step is committed in
// its local tier (run.Tiered.Committed): a due step is persisted in the
// background and local retention runs. *out receives the JSON list of the
// persists that ended since the last call ([{step, retries, bytes}]); a
// failed one fails the call (its class), never dropped.
//
//export ckpt_tiered_committed
func ckpt_tiered_committed(tok, h C.uintptr_t, step C.int64_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_tiered_committed", cls, rule, msg, func() error {
		return withHandle(h, "tiered run", func(th *tieredHandle) error {
			return withCall(tok, nil, func(ctx context.Context) error {
				if th.env != nil {
					ctx = backend.WithEnv(ctx, th.env)
				}
				ended, err := th.t.Committed(ctx, int64(step))
				if err != nil {
					return err
				}
				return persistsErr(ended, out)
			})
		})
	})
}

// ckpt_tiered_wait waits (at most grace_ms milliseconds; 0: no bound) until
// no persist of h is in flight or queued (run.Tiered.Wait); *out as
// ckpt_tiered_committed. Grace running out fails the call.
//
//export ckpt_tiered_wait
func ckpt_tiered_wait(tok, h C.uintptr_t, graceMS C.int64_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_tiered_wait", cls, rule, msg, func() error {
		return withHandle(h, "tiered run", func(th *tieredHandle) error {
			return withCall(tok, nil, func(ctx context.Context) error {
				ended, err := th.t.Wait(ctx, time.Duration(graceMS)*time.Millisecond)
				if perr := persistsErr(ended, out); perr != nil {
					return perr
				}
				return err
			})
		})
	})
}

// ckpt_tiered_close waits at most grace_ms milliseconds for the persist in
// flight (and the queued one), cancels what is left and releases h
// (run.Tiered.Close); a persist that failed since the last report, or the
// grace running out, fails the call (h is released all the same).
//
//export ckpt_tiered_close
func ckpt_tiered_close(h C.uintptr_t, graceMS C.int64_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_tiered_close", cls, rule, msg, func() error {
		th, err := remove[*tieredHandle](&handles, uint64(h), "tiered run")
		if err != nil {
			return err
		}
		err = th.t.Close(time.Duration(graceMS) * time.Millisecond)
		return errors.Join(err, closeStore(th.local), closeStore(th.durable))
	})
}

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
	"sync"
	"unsafe"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/loader"
	ckrun "github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/statedict"
)

// ckptHandle is an open checkpoint: the store it was read from (every
// data read goes through it) and its metadata, read once.
type ckptHandle struct {
	storeHandle
	ck   *loader.Checkpoint
	info ckptInfo
	// run is the run ck was chosen from (nil when the URL was the
	// checkpoint itself); it shares its driver with st.
	run *backend.Store
	// env is the environment the checkpoint was opened with (nil: the
	// process's).
	env map[string]string
	// borrowed: a checkpoint a resume (ckpt_run_resume) lends its load
	// callback; the resume owns its store.
	borrowed bool
	// outcome is the last load's, and a failure the caller reported
	// (ckpt_checkpoint_fail), for the resume that lent the handle.
	outcome struct {
		sync.Mutex
		rep      *loader.Report
		err      error
		reported error
	}
}

// ckptInfo describes the checkpoint a resume chose.
type ckptInfo struct {
	URL       string    `json:"url"`
	Name      string    `json:"name,omitempty"`
	Step      int64     `json:"step"`
	Format    string    `json:"format"`
	Iteration int64     `json:"iteration"`
	Optimizer string    `json:"optimizer"`
	Skipped   []skipped `json:"skipped"`
	// None is true when url is a run without any committed checkpoint.
	None bool `json:"none,omitempty"`
	// Empty is true (with None) when nothing at all is stored under url:
	// a fresh run, or a mistyped URL (the caller decides, must_exist).
	Empty bool `json:"empty,omitempty"`
}

type skipped struct {
	URL    string `json:"url"`
	Reason string `json:"reason"`
}

// ruleOf names the resume rule an error breaks, for the Python exception
// types (all of class BadCheckpoint or Usage, so the class alone cannot
// tell them apart): loader.RuleOf, the one rule mapping.
func ruleOf(err error) string { return loader.RuleOf(err) }

// openCheckpoint opens url as a checkpoint, or, when url is a run, the
// newest committed checkpoint of the run that verifies (run.Choose, the one
// rule the CLI follows too). Each candidate's metadata is read once, and
// the chosen checkpoint keeps it for the load.
func openCheckpoint(ctx context.Context, url string) (*ckptHandle, error) {
	sh, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = closeStore(sh)
		}
	}()
	// Committed checkpoints of which none verifies are a *run.RefusedError:
	// the newest one's problem decides class and rule, never a fresh start.
	ch, err := ckrun.Choose(ctx, sh.st, ckrun.LatestOptions{})
	if err != nil {
		return nil, err
	}
	out := skippedOf(ch.Skipped, 0)
	ok = true
	if ch.Checkpoint == nil {
		// A fresh run (or only uncommitted prefixes): nothing to resume.
		return &ckptHandle{storeHandle: *sh, info: ckptInfo{URL: sh.st.String(), None: true, Empty: ch.Empty, Skipped: out}}, nil
	}
	h := newCkptHandle(sh, ch.Checkpoint, ch.Entry.Name, out)
	if ch.Run != nil {
		h.info.Step = ch.Entry.Step
		h.run = sh.st
	}
	return h, nil
}

// skippedOf lists ss for the caller (only those of reason why, 0: all).
func skippedOf(ss []ckrun.Skipped, why ckrun.Why) []skipped {
	out := []skipped{}
	for _, s := range ss {
		if why == 0 || s.Why == why {
			out = append(out, skipped{URL: s.Entry.URL, Reason: s.Reason})
		}
	}
	return out
}

func nonNil(s []skipped) []skipped {
	if s == nil {
		return []skipped{}
	}
	return s
}

func newCkptHandle(sh *storeHandle, ck *loader.Checkpoint, name string, skips []skipped) *ckptHandle {
	md := ck.Metadata()
	h := &ckptHandle{storeHandle: storeHandle{st: ck.Store()}, ck: ck}
	h.info = ckptInfo{URL: ck.URL(), Name: name, Step: md.Training.Iteration, Format: ck.FormatName(),
		Iteration: md.Training.Iteration, Optimizer: string(md.Training.Optimizer), Skipped: nonNil(skips)}
	return h
}

// closeStore closes a store (its counter, if any, stays counted).
func closeStore(sh *storeHandle) error { return sh.st.Close() }

// ckpt_checkpoint_open opens the checkpoint at url, or the newest committed
// valid checkpoint of the run at url (as `ckpt latest`), reading its
// metadata once. *info receives JSON {url, name, step, format, iteration,
// optimizer, skipped, none}; "none": true means the run has no committed
// checkpoint (the handle is still returned and must be closed). The handle
// also serves ckpt_read, ckpt_stat and ckpt_list on the checkpoint prefix.
//
//export ckpt_checkpoint_open
func ckpt_checkpoint_open(tok C.uintptr_t, url, env *C.char, out *C.uintptr_t, info **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_checkpoint_open", cls, rule, msg, func() error {
		return withCall(tok, env, func(ctx context.Context) error {
			h, err := openCheckpoint(ctx, C.GoString(url))
			if err != nil {
				return err
			}
			h.env, _ = envOf(env)
			if err := setJSON(info, h.info); err != nil {
				_ = closeStore(&h.storeHandle)
				return err
			}
			*out = C.uintptr_t(handles.add(h))
			return nil
		})
	})
}

// ckpt_checkpoint_metadata copies the metadata object's bytes, exactly as
// they were read at open, into *out (*n bytes, freed with ckpt_free).
//
//export ckpt_checkpoint_metadata
func ckpt_checkpoint_metadata(h C.uintptr_t, out *unsafe.Pointer, n *C.int64_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_checkpoint_metadata", cls, rule, msg, func() error {
		return withHandle(h, "checkpoint", func(ch *ckptHandle) error {
			if ch.ck == nil {
				return fmt.Errorf("%s: %w", ch.st, catalog.ErrNoCommittedCheckpoint)
			}
			raw := ch.ck.RawMetadata()
			*out = C.CBytes(raw)
			*n = C.int64_t(len(raw))
			return nil
		})
	})
}

// ckpt_checkpoint_close releases a checkpoint handle, once the calls in
// flight on it have returned.
//
//export ckpt_checkpoint_close
func ckpt_checkpoint_close(h C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_checkpoint_close", cls, rule, msg, func() error {
		ch, err := remove[*ckptHandle](&handles, uint64(h), "checkpoint")
		if err != nil || ch.borrowed {
			return err // a borrowed checkpoint's resume closes its store
		}
		return closeStore(&ch.storeHandle)
	})
}

// loadSpec is the JSON a caller passes to ckpt_checkpoint_load: the target
// of every local rank and the options of loader.Options.
type loadSpec struct {
	Targets []struct {
		// Tensors are loaded into the buffers passed to
		// ckpt_checkpoint_load.
		Tensors []tensorSpec `json:"tensors"`
		Bytes   []string     `json:"bytes"`
	} `json:"targets"`
	NoLoadOptimizer bool   `json:"no_load_optimizer"`
	ModelPrefix     string `json:"model_prefix"`
	OptimizerPrefix string `json:"optimizer_prefix"`
	// OptimizerSlots is accepted and ignored (older Python packages send
	// it): each parameter's slots are those its target holds.
	OptimizerSlots []string `json:"optimizer_slots"`
	// ParamGroups are the optimizer's param groups (each the fqns of its
	// parameters, in group order), checked against the checkpoint's before
	// any buffer is written (loader.Options.ParamGroups).
	ParamGroups [][]string `json:"param_groups"`
	Frozen      []string   `json:"frozen"`
	Concurrency int        `json:"concurrency"`
	Quiet       bool       `json:"quiet"`
	// OnePass loads in one pass, each tensor written once as its bytes
	// are checked (for a resume that may fall back past damage: every
	// attempt overwrites every target). Without it the load is
	// transactional: a failure leaves the buffers as they were.
	OnePass bool `json:"one_pass"`
}

// ckpt_checkpoint_load runs loader.Checkpoint.Load: the resume rules of
// docs/RESUME.md are checked and every byte is read and CRC-checked before
// any target buffer changes; then the tensors are copied into the C buffers
// bufs (nbufs of them) that spec (JSON, see loadSpec) assigns to the target
// tensors. *report receives the JSON report, bytes values included.
//
//export ckpt_checkpoint_load
func ckpt_checkpoint_load(tok, h C.uintptr_t, spec *C.char, bufs *unsafe.Pointer, nbufs C.int, report **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_checkpoint_load", cls, rule, msg, func() error {
		return withCall(tok, nil, func(ctx context.Context) error {
			return withHandle(h, "checkpoint", func(ch *ckptHandle) error {
				if ch.ck == nil {
					return fmt.Errorf("%s: %w", ch.st, catalog.ErrNoCommittedCheckpoint)
				}
				var ls loadSpec
				if err := json.Unmarshal([]byte(C.GoString(spec)), &ls); err != nil {
					return fmt.Errorf("%w: load spec: %v", errUsage, err)
				}
				var ptrs []unsafe.Pointer
				if nbufs > 0 {
					ptrs = unsafe.Slice(bufs, int(nbufs))
				}
				if ch.env != nil {
					ctx = backend.WithEnv(ctx, ch.env)
				}
				opts := loader.Options{NoLoadOptimizer: ls.NoLoadOptimizer, ModelPrefix: ls.ModelPrefix, OptimizerPrefix: ls.OptimizerPrefix,
					ParamGroups: ls.ParamGroups, Frozen: ls.Frozen, Concurrency: ls.Concurrency, Transactional: !ls.OnePass}
				if ls.Quiet {
					opts.Logger = slog.New(slog.DiscardHandler)
				}
				targets, err := ls.targets(ptrs)
				var rep *loader.Report
				if err == nil {
					rep, err = ch.ck.Load(ctx, targets, opts)
				}
				ch.outcome.Lock()
				ch.outcome.rep, ch.outcome.err, ch.outcome.reported = rep, err, nil
				ch.outcome.Unlock()
				if err != nil {
					return err
				}
				out := newLoadReport(rep)
				out.Bytes = make([]map[string][]byte, len(targets))
				for r, sd := range targets {
					out.Bytes[r] = sd.Bytes
				}
				return setJSON(report, out)
			})
		})
	})
}

// targets builds the load targets of every local rank over the C buffers
// (fresh statedicts on every call, the same buffers).
func (ls *loadSpec) targets(ptrs []unsafe.Pointer) ([]*statedict.StateDict, error) {
	targets := make([]*statedict.StateDict, len(ls.Targets))
	for r, t := range ls.Targets {
		sd := statedict.New()
		for _, ts := range t.Tensors {
			sh, err := ts.shard(ptrs)
			if err != nil {
				return nil, err
			}
			sd.Tensors[ts.Key] = sh
		}
		for _, k := range t.Bytes {
			sd.Bytes[k] = nil
		}
		targets[r] = sd
	}
	return targets, nil
}

// tensorSpec is one tensor crossing the ABI in a load or save spec: its
// key, dtype, global shape, the chunk box this rank holds and the C buffer
// holding the chunk.
type tensorSpec struct {
	Key     string  `json:"key"`
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"offsets"`
	Sizes   []int64 `json:"sizes"`
	// Buf indexes the buffers passed with the spec: C memory of NBytes
	// bytes (row-major, contiguous, little-endian), used for the duration
	// of the call only.
	Buf    int   `json:"buf"`
	NBytes int64 `json:"nbytes"`
}

// shard is the tensor as a statedict shard over its C buffer (no copy).
func (ts *tensorSpec) shard(ptrs []unsafe.Pointer) (*statedict.Shard, error) {
	data := []byte{}
	if ts.NBytes > 0 {
		if ts.Buf < 0 || ts.Buf >= len(ptrs) || ptrs[ts.Buf] == nil {
			return nil, fmt.Errorf("%w: tensor %q: buffer %d of %d", errUsage, ts.Key, ts.Buf, len(ptrs))
		}
		data = cbytes(ptrs[ts.Buf], C.int64_t(ts.NBytes))
	}
	offs, sizes := ts.Offsets, ts.Sizes
	if offs == nil {
		offs = make([]int64, len(ts.Shape))
	}
	if sizes == nil {
		sizes = ts.Shape
	}
	return &statedict.Shard{DType: statedict.DType(ts.DType), GlobalShape: ts.Shape, Offsets: offs, Sizes: sizes, Data: data}, nil
}

// Package run is the unit users think in: a run of checkpoints, the
// step-NNNNNNNN prefixes under one URL. It owns the run's layout (step
// names, the coordinator's prefix), the one rule that tells a checkpoint
// URL from a run URL (Choose), saving a step (Save, SaveAsync), resuming
// (Resume: the newest valid checkpoint every rank can load, never a silent
// restart, falling back past damaged data) and retention (Retain). The
// CLI, the C ABI and the Python package are thin clients of it.
package run

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// CoordPrefix is the prefix under a run where ranks that coordinate through
// the store (coordinator.NewStore) keep their rounds: never a step, so
// listing, gc and resume never take it for a checkpoint.
const CoordPrefix = "_coord"

// Run is a run of checkpoints under one store prefix.
type Run struct {
	st  *backend.Store
	own bool
}

// Open opens the run at url (a local path or any registered URL scheme).
// Close releases it.
func Open(ctx context.Context, url string) (*Run, error) {
	st, err := backend.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	return &Run{st: st, own: true}, nil
}

// New returns the run whose prefix is st. Close does not close st: the
// caller keeps owning it.
func New(st *backend.Store) *Run { return &Run{st: st} }

// Close releases the store when Open opened it.
func (r *Run) Close() error {
	if r.own {
		return r.st.Close()
	}
	return nil
}

// Store is the run's prefix.
func (r *Run) Store() *backend.Store { return r.st }

// String is the run's URL, credentials redacted.
func (r *Run) String() string { return r.st.String() }

// StepURL is the URL of step's checkpoint (StepName under the run).
func (r *Run) StepURL(step int64) string { return r.st.URL(catalog.StepName(step)) }

// URLIn is the URL of name (a step name, CoordPrefix) under the run URL
// runURL, its query (the backend's options) kept: for callers that hold a
// URL rather than an open run (the C ABI's Python).
func URLIn(runURL, name string) string {
	base, query, ok := strings.Cut(runURL, "?")
	u := strings.TrimRight(base, "/") + "/" + name
	if ok {
		u += "?" + query
	}
	return u
}

// Step returns the store of step's checkpoint prefix.
func (r *Run) Step(step int64) (*backend.Store, error) { return r.st.Sub(catalog.StepName(step)) }

// NewCoordinator returns rank's handle on the store coordinator of group
// (unique per attempt, e.g. the step name and a job id) of world ranks,
// exchanging values under the run's CoordPrefix. Every rank opens the run
// itself and calls it with the same group.
func (r *Run) NewCoordinator(group string, rank, world int, opts coordinator.StoreOptions) (*coordinator.StoreCoordinator, error) {
	st, err := r.st.Sub(CoordPrefix)
	if err != nil {
		return nil, err
	}
	return coordinator.NewStore(st, group, rank, world, opts)
}

// Save saves this rank's sd as step's checkpoint, collectively over c
// (saver.Save). opts.Iteration defaults to step.
func (r *Run) Save(ctx context.Context, step int64, c coordinator.Coordinator, sd *statedict.StateDict, opts saver.Options) (*saver.Result, error) {
	st, err := r.stepFor(step, &opts)
	if err != nil {
		return nil, err
	}
	return saver.Save(ctx, st, c, sd, opts)
}

// SaveLocal saves the state of every rank of one process (sds, one per
// rank) as step's checkpoint (saver.SaveLocal). opts.Iteration defaults to
// step.
func (r *Run) SaveLocal(ctx context.Context, step int64, sds []*statedict.StateDict, opts saver.Options) (*saver.Result, error) {
	st, err := r.stepFor(step, &opts)
	if err != nil {
		return nil, err
	}
	return saver.SaveLocal(ctx, st, sds, opts)
}

// SaveAsync is Save through the asynchronous saver s: it returns once the
// state is staged (saver.Saver.SaveAsync).
func (r *Run) SaveAsync(ctx context.Context, s *saver.Saver, step int64, c coordinator.Coordinator, sd *statedict.StateDict, opts saver.Options) (*saver.Handle, error) {
	st, err := r.stepFor(step, &opts)
	if err != nil {
		return nil, err
	}
	return s.SaveAsync(ctx, st, c, sd, opts)
}

// SaveLocalAsync is SaveLocal through the asynchronous saver s
// (saver.Saver.SaveLocalAsync).
func (r *Run) SaveLocalAsync(ctx context.Context, s *saver.Saver, step int64, sds []*statedict.StateDict, opts saver.Options) (*saver.Handle, error) {
	st, err := r.stepFor(step, &opts)
	if err != nil {
		return nil, err
	}
	return s.SaveLocalAsync(ctx, st, sds, opts)
}

func (r *Run) stepFor(step int64, opts *saver.Options) (*backend.Store, error) {
	if step < 0 {
		return nil, fmt.Errorf("save %s: %w: step %d is negative", r, ErrInvalidArgument, step)
	}
	if opts.Iteration == 0 {
		opts.Iteration = step
	}
	return r.Step(step)
}

// StepOf returns the step name and step of the checkpoint URL url when the
// last segment of its path is a step name (step-NNNNNNNN): a URL that names
// a step of a run, never a run.
func StepOf(url string) (name string, step int64, ok bool) {
	where, _, _ := strings.Cut(url, "?")
	name = path.Base(strings.TrimSuffix(where, "/"))
	step, ok = catalog.ParseStep(name)
	return name, step, ok
}

// openStep opens the run's checkpoint name.
func (r *Run) openStep(ctx context.Context, name string) (*loader.Checkpoint, error) {
	st, err := r.st.Sub(name)
	if err != nil {
		return nil, err
	}
	return loader.Open(ctx, st)
}

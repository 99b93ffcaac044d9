package run

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/statedict"
)

// LoadFunc loads checkpoint c into the caller's targets. It must build
// fresh targets or overwrite every target on each call: a load that falls
// back past damaged data calls it again, and a failed one-pass load leaves
// the targets partly filled.
type LoadFunc func(ctx context.Context, c *loader.Checkpoint) (*loader.Report, error)

// Into is the LoadFunc that loads into the targets targets returns (one
// per local rank; called once per attempt) with opts.
func Into(targets func() []*statedict.StateDict, opts loader.Options) LoadFunc {
	return func(ctx context.Context, c *loader.Checkpoint) (*loader.Report, error) {
		return c.Load(ctx, targets(), opts)
	}
}

// DataDamaged tells whether a load failed on the stored bytes themselves (a
// CRC32C mismatch, an invalid bool byte, a missing or truncated data
// object): damage the metadata could not show, found while reading, so an
// older checkpoint may still be good.
func DataDamaged(err error) bool {
	return errors.Is(err, loader.ErrChecksum) || errors.Is(err, loader.ErrInvalidBool) || errors.Is(err, loader.ErrMissingObject)
}

// Loaded is the outcome of a load of the run's checkpoints.
type Loaded struct {
	// Checkpoint is the checkpoint loaded, Entry its step.
	Checkpoint *loader.Checkpoint
	Entry      catalog.Entry
	// Report is its load report.
	Report *loader.Report
	// Skipped are the checkpoints passed over on the way, newest first:
	// damaged ones (Why Damaged) and the older ones that were not valid.
	Skipped []Skipped
}

// Load loads found (a checkpoint of the run, from Latest or Choose) with
// load. When its data turns out damaged (DataDamaged) it says so through
// logf (nil: silent) and tries the next older valid checkpoint, until one
// loads; any other failure is returned as it is. This is the one fallback
// rule of a resume: Resume, `ckpt train --resume` and the C ABI's load all
// use it.
//
// Every rule that can be checked before a byte is written is checked on
// each candidate, so an older checkpoint that breaks one (other optimizer
// param groups, say) is refused; the targets are then as the damaged
// attempt left them, and the error says so: it wraps the refusal (its rule
// and class are the error's), names the damage, and wraps
// loader.ErrTargetsPartlyFilled when that attempt had written into the
// targets.
func (r *Run) Load(ctx context.Context, found *Found, load LoadFunc, logf func(string, ...any)) (*Loaded, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	out := &Loaded{Skipped: []Skipped{}}
	var entries []catalog.Entry
	var damaged error // the last damaged attempt's error
	for {
		c := found.Checkpoint
		rep, err := load(ctx, c)
		if err == nil {
			out.Checkpoint, out.Entry, out.Report = c, found.Entry, rep
			return out, nil
		}
		if !DataDamaged(err) {
			if damaged != nil {
				// The refusal decides the error's rule and class; the
				// damage is named, not wrapped (it would make the error a
				// checksum failure, and DataDamaged true), except that
				// the targets are partly filled.
				if errors.Is(damaged, loader.ErrTargetsPartlyFilled) {
					return nil, fmt.Errorf("%w (the next older checkpoint, after falling back from a damaged one: %v): %w", err, damaged, loader.ErrTargetsPartlyFilled)
				}
				return nil, fmt.Errorf("%w (the next older checkpoint, after falling back from a damaged one: %v)", err, damaged)
			}
			return nil, err
		}
		damaged = err
		e := found.Entry
		e.Committed = true
		out.Skipped = append(out.Skipped, Skipped{Skipped: catalog.Skipped{Entry: e, Reason: err.Error(), Err: err}, Why: Damaged})
		if entries == nil {
			var lerr error
			if entries, lerr = catalog.List(ctx, r.st); lerr != nil {
				return nil, fmt.Errorf("%w; listing %s for an older checkpoint: %w", err, r.st, lerr)
			}
		}
		// Only the checkpoints older than the damaged one.
		i := 0
		for i < len(entries) && entries[i].Step < found.Step {
			i++
		}
		entries = entries[:i]
		older, skipped, lerr := catalog.LatestIn(ctx, r.st, entries, false)
		for _, s := range skipped {
			logf("skipping %s: %s", s.Entry.URL, s.Reason)
		}
		out.Skipped = append(out.Skipped, fromCatalog(skipped)...)
		if lerr != nil {
			return nil, fmt.Errorf("%w; and no older checkpoint is valid: %w", err, lerr)
		}
		logf("checkpoint %s is damaged (%v); falling back to the next older valid checkpoint, %s", c.URL(), err, older.Checkpoint.URL())
		found = older
	}
}

// ResumeOptions tune Resume.
type ResumeOptions struct {
	// Load loads a chosen checkpoint into the caller's targets (Into
	// builds one).
	Load LoadFunc
	// Coordinator, when set with more than one rank, makes the ranks agree
	// on one step: rank 0 chooses, every rank loads (falling back past its
	// own damaged data), and all resume from the oldest step any rank
	// reached, which every rank then loads. Every rank calls Resume.
	Coordinator coordinator.Coordinator
	// AllowFresh lets a run under which nothing at all is stored start
	// fresh; without it that is ErrNothingStored (a mistyped URL must not
	// start a new run). A run holding only uncommitted prefixes always
	// starts fresh.
	AllowFresh bool
	// Deep verifies every byte of each candidate before choosing it.
	Deep bool
	// Logf, when set, is told about each checkpoint passed over.
	Logf func(format string, args ...any)
}

// Resumed is what Resume did.
type Resumed struct {
	// Fresh is true when there was nothing to resume (no committed
	// checkpoint); Empty when, moreover, nothing at all is stored.
	Fresh, Empty bool
	// Checkpoint is the checkpoint loaded (nil when Fresh), Entry its step
	// and Report its load report.
	Checkpoint *loader.Checkpoint
	Entry      catalog.Entry
	Report     *loader.Report
	// Skipped are the newer checkpoints passed over, newest first, and why.
	Skipped []Skipped
}

// Resume loads the newest valid checkpoint of the run with opts.Load:
// newest committed first, skipping uncommitted and invalid ones; past
// damaged data it falls back to the next older valid one (Load). It never
// restarts silently: committed checkpoints of which none is valid are a
// *RefusedError, nothing stored at all is ErrNothingStored unless
// opts.AllowFresh; only a run without a committed checkpoint resumes
// Fresh. With opts.Coordinator every rank resumes from the same step.
func (r *Run) Resume(ctx context.Context, opts ResumeOptions) (*Resumed, error) {
	if opts.Load == nil {
		return nil, fmt.Errorf("resume %s: %w: no Load function", r, ErrInvalidArgument)
	}
	c := opts.Coordinator
	if c == nil || c.WorldSize() <= 1 {
		res, found, err := r.choose(ctx, opts)
		if err != nil || found == nil {
			return res, err
		}
		l, err := r.Load(ctx, found, opts.Load, opts.Logf)
		if err != nil {
			return nil, err
		}
		return res.loaded(l), nil
	}
	return r.resumeRanks(ctx, c, opts)
}

// ResumeURL resumes from what st names, by Choose's rule: a checkpoint
// (a format's metadata object at st's root) is loaded as it is with
// opts.Load, without a choice or a fallback (its damage is the error), by
// every rank alike; a run is resumed (Run.Resume: the newest valid step,
// falling back past damage, the ranks agreeing through opts.Coordinator).
// Data without metadata and no steps is the loader's error; a step-named
// URL under which nothing is stored is ErrNothingStored (a typo, never a
// fresh run). Resumed.Entry of a checkpoint is the step of its name
// (step-NNNNNNNN), Step -1 when it has none.
func ResumeURL(ctx context.Context, st *backend.Store, opts ResumeOptions) (*Resumed, error) {
	if opts.Load == nil {
		return nil, fmt.Errorf("resume %s: %w: no Load function", st, ErrInvalidArgument)
	}
	c, err := loader.Open(ctx, st)
	if err == nil {
		e := catalog.Entry{Step: -1, URL: c.URL(), Committed: true, Format: c.FormatName()}
		if name, step, ok := StepOf(st.String()); ok {
			e.Name, e.Step = name, step
		}
		rep, err := opts.Load(ctx, c)
		if err != nil {
			return nil, err
		}
		return &Resumed{Checkpoint: c, Entry: e, Report: rep, Skipped: []Skipped{}}, nil
	}
	if !notACheckpoint(err) {
		return nil, err
	}
	if err := runOrIncomplete(ctx, st, err); err != nil {
		return nil, err
	}
	if _, _, named := StepOf(st.String()); named {
		empty, ierr := catalog.IsEmpty(ctx, st)
		if ierr != nil {
			return nil, ierr
		}
		if empty {
			return nil, fmt.Errorf("resume %s: %w: nothing is stored there (check the URL)", st, ErrNothingStored)
		}
	}
	return New(st).Resume(ctx, opts)
}

// choose is rank 0's decision: the newest valid checkpoint open, or a
// fresh start, or the refusal.
func (r *Run) choose(ctx context.Context, opts ResumeOptions) (*Resumed, *Found, error) {
	found, skipped, err := r.Latest(ctx, LatestOptions{Deep: opts.Deep})
	if opts.Logf != nil {
		for _, s := range skipped {
			opts.Logf("skipping %s: %s", s.Entry.URL, s.Reason)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	res := &Resumed{Skipped: skipped}
	if found != nil {
		res.Entry = found.Entry
		return res, found, nil
	}
	res.Fresh = true
	if res.Empty, err = catalog.IsEmpty(ctx, r.st); err != nil {
		return nil, nil, err
	}
	if res.Empty && !opts.AllowFresh {
		return nil, nil, fmt.Errorf("resume %s: %w: nothing is stored there (check the URL)", r, ErrNothingStored)
	}
	return res, nil, nil
}

// loaded completes res with the load l.
func (res *Resumed) loaded(l *Loaded) *Resumed {
	res.Checkpoint, res.Entry, res.Report = l.Checkpoint, l.Entry, l.Report
	res.Skipped = append(res.Skipped, l.Skipped...)
	return res
}

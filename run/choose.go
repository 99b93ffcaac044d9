package run

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/loader"
)

// Errors of a run. Each belongs to one ckpterr class.
var (
	// ErrNoValidCheckpoint: committed checkpoints exist under the run but
	// none is valid. A resume refuses rather than start over (a fresh
	// start would silently throw the run away). See RefusedError.
	ErrNoValidCheckpoint = ckpterr.New(ckpterr.BadCheckpoint, "committed checkpoints exist but none is valid")
	// ErrNothingStored: nothing at all is stored under the URL (a mistyped
	// URL, or a fresh run a caller did not allow).
	ErrNothingStored = ckpterr.New(ckpterr.NotFound, "no such path")
	// ErrInvalidArgument: a negative step, a missing Load function.
	ErrInvalidArgument = ckpterr.New(ckpterr.Usage, "invalid argument")
	// ErrUnreadable: no committed checkpoint of the run could be read, and
	// storage refused to read some of its checkpoints (whether they are
	// committed is unknown): neither a fresh start nor "none committed".
	ErrUnreadable = ckpterr.New(ckpterr.Access, "no readable committed checkpoint")
)

// Why is the kind of reason a checkpoint was skipped.
type Why int

// The reasons.
const (
	// Uncommitted: a step prefix without a metadata object (a save in
	// progress, or an abandoned one).
	Uncommitted Why = iota + 1
	// Invalid: committed, but its metadata does not open or does not
	// verify.
	Invalid
	// Damaged: it verified, but loading found its data damaged (a CRC32C
	// mismatch, a missing or truncated data object).
	Damaged
	// OtherRank: this rank could load it, another rank could not (its
	// data was damaged for that rank): every rank resumes from the same,
	// older, step.
	OtherRank
	// Unreadable: storage refused to read it (permissions); it may be
	// committed.
	Unreadable
)

// String names the reason as JSON and logs show it.
func (w Why) String() string {
	switch w {
	case Uncommitted:
		return "uncommitted"
	case Invalid:
		return "invalid"
	case Damaged:
		return "damaged"
	case OtherRank:
		return "other-rank"
	case Unreadable:
		return "unreadable"
	}
	return "unknown"
}

// Skipped is a checkpoint of the run passed over, newest first, and why.
type Skipped struct {
	catalog.Skipped
	Why Why
}

func fromCatalog(ss []catalog.Skipped) []Skipped {
	out := make([]Skipped, 0, len(ss))
	for _, s := range ss {
		why := Invalid
		switch {
		case s.Entry.Unreadable != "":
			why = Unreadable
		case !s.Entry.Committed:
			why = Uncommitted
		}
		out = append(out, Skipped{Skipped: s, Why: why})
	}
	return out
}

// RefusedError is the refusal of a run whose committed checkpoints all fail:
// it matches ErrNoValidCheckpoint (class bad-checkpoint, unless the newest
// one's problem has a class of its own) and the newest one's problem (its
// rule's sentinel, so errors.Is(err, loader.ErrChecksum) and the like tell
// what is wrong with it).
type RefusedError struct {
	// Run is the run's URL.
	Run string
	// Committed counts the committed checkpoints that failed.
	Committed int
	// Newest is the newest of them, with its reason.
	Newest Skipped
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s: every committed checkpoint failed verification (%d committed, none valid; newest: %s: %s); fix or remove them, or start a new run",
		e.Run, e.Committed, e.Newest.Entry.URL, e.Newest.Reason)
}

// Unwrap returns the newest checkpoint's problem and ErrNoValidCheckpoint.
func (e *RefusedError) Unwrap() []error {
	if e.Newest.Err == nil {
		return []error{ErrNoValidCheckpoint}
	}
	return []error{e.Newest.Err, ErrNoValidCheckpoint}
}

// Class is the newest problem's class, bad-checkpoint when it has none.
func (e *RefusedError) Class() ckpterr.Class {
	if c := ckpterr.ClassOf(e.Newest.Err); e.Newest.Err != nil && c != ckpterr.Internal {
		return c
	}
	return ckpterr.BadCheckpoint
}

// LatestOptions tune Latest.
type LatestOptions = catalog.LatestOptions

// Found is the checkpoint Latest chose, open (its metadata read once).
type Found = catalog.Found

// Latest opens the newest committed checkpoint of the run that verifies
// (every byte with opts.Deep) and returns it with the newer ones it
// skipped. With none found it returns nil and: a *RefusedError when
// committed checkpoints exist but none is valid; ErrUnreadable (class
// access) when none is committed but storage refused to read some; nil
// when none is committed (a fresh run, or one whose only saves never
// committed).
func (r *Run) Latest(ctx context.Context, opts LatestOptions) (*Found, []Skipped, error) {
	found, skipped, err := catalog.LatestWith(ctx, r.st, opts)
	out := fromCatalog(skipped)
	switch {
	case err == nil:
		return found, out, nil
	case !errors.Is(err, catalog.ErrNoCommittedCheckpoint):
		return nil, out, err
	}
	if err := refusal(r.st, out); err != nil {
		return nil, out, err
	}
	for _, s := range out {
		if s.Why == Unreadable {
			return nil, out, fmt.Errorf("%s: %w (%s is unreadable: %s); make it readable or remove it", r.st, ErrUnreadable, s.Entry.URL, s.Entry.Unreadable)
		}
	}
	return nil, out, nil
}

// refusal is the RefusedError of skipped when any of them is committed.
func refusal(run *backend.Store, skipped []Skipped) error {
	var e *RefusedError
	for _, s := range skipped {
		if !s.Entry.Committed {
			continue
		}
		if e == nil {
			e = &RefusedError{Run: run.String(), Newest: s}
		}
		e.Committed++
	}
	if e == nil {
		return nil
	}
	return e
}

// Choice is what a URL names, opened: a checkpoint, or a run and the
// newest valid checkpoint of it.
type Choice struct {
	// Checkpoint is the checkpoint to read: the URL itself, or the run's
	// newest valid one; nil when the run holds no committed checkpoint.
	Checkpoint *loader.Checkpoint
	// Run is the run the URL names (nil when it names a checkpoint); it
	// shares its store with the caller's.
	Run *Run
	// Entry is the chosen step of the run (Run only).
	Entry catalog.Entry
	// Skipped are the run's newer checkpoints passed over, and why.
	Skipped []Skipped
	// Empty is true (with a nil Checkpoint) when nothing at all is stored
	// under the URL: a fresh run, or a mistyped URL; the caller decides.
	Empty bool
	// NotACheckpoint is why the URL itself is not a checkpoint (the
	// loader's error), for a caller that wanted one (Run only).
	NotACheckpoint error
}

// Choose applies the one rule that tells a checkpoint from a run: st is a
// checkpoint when a format's metadata object is at its root; otherwise it
// is a run when it holds nothing (a fresh run) or step-NNNNNNNN prefixes,
// and the run's newest valid checkpoint is chosen (Latest); anything else
// (data without metadata and no steps: an incomplete checkpoint, or a
// metadata object that does not decode) is the loader's error. A run whose
// committed checkpoints all fail is a *RefusedError; a URL whose last
// segment is a step name under which nothing is stored is ErrNothingStored
// (a typo, never a fresh run).
func Choose(ctx context.Context, st *backend.Store, opts LatestOptions) (*Choice, error) {
	c, err := loader.Open(ctx, st)
	if err == nil {
		return &Choice{Checkpoint: c, Skipped: []Skipped{}}, nil
	}
	if !notACheckpoint(err) {
		return nil, err
	}
	if err := runOrIncomplete(ctx, st, err); err != nil {
		return nil, err
	}
	r := New(st)
	found, skipped, lerr := r.Latest(ctx, opts)
	ch := &Choice{Run: r, Skipped: skipped, NotACheckpoint: err}
	switch {
	case lerr != nil:
		return nil, lerr
	case found != nil:
		ch.Checkpoint, ch.Entry = found.Checkpoint, found.Entry
		return ch, nil
	}
	if ch.Empty, lerr = catalog.IsEmpty(ctx, st); lerr != nil {
		return nil, lerr
	}
	if _, _, named := StepOf(st.String()); ch.Empty && named {
		return nil, fmt.Errorf("open checkpoint %s: %w: nothing is stored there (check the URL)", st, ErrNothingStored)
	}
	return ch, nil
}

// notACheckpoint reports whether err, from opening a URL as a checkpoint,
// says that no metadata object is at its root: the URL may be a run. A
// refusal to read (class access: a step directory storage may not list)
// may be a run too: the run's listing skips what it may not read.
func notACheckpoint(err error) bool {
	return errors.Is(err, loader.ErrNoCheckpoint) || errors.Is(err, loader.ErrIncomplete) || ckpterr.ClassOf(err) == ckpterr.Access
}

// runOrIncomplete is nil when st, which did not open as a checkpoint
// (openErr), may be a run; openErr when it holds data without metadata
// (loader.ErrIncomplete) that is neither a step nor the store
// coordinator's (CoordPrefix: a run whose only objects are a resume's
// coordination rounds is a fresh run, not an incomplete checkpoint).
func runOrIncomplete(ctx context.Context, st *backend.Store, openErr error) error {
	if !errors.Is(openErr, loader.ErrIncomplete) {
		return nil
	}
	es, err := Steps(ctx, st, openErr)
	if err != nil || len(es) > 0 {
		return err
	}
	other := false
	err = st.ListDelimited(ctx, "", func(o backend.ObjectInfo) error {
		if !o.IsPrefix || o.Key != CoordPrefix+"/" {
			other = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list %s: %w", st, err)
	}
	if other {
		return openErr
	}
	return nil
}

// Steps is the run half of Choose's rule for a caller that tried st as a
// checkpoint itself (transfer.Copy, say) and got openErr: when openErr says
// no metadata object is at st's root, it lists st's steps (oldest first,
// catalog.List; none: st is not a run of any checkpoint); otherwise it
// returns openErr.
func Steps(ctx context.Context, st *backend.Store, openErr error) ([]catalog.Entry, error) {
	if !notACheckpoint(openErr) {
		return nil, openErr
	}
	return catalog.List(ctx, st)
}

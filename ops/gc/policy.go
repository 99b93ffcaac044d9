// Package gc removes old checkpoints of a training run under a retention
// policy. Deciding is a pure function (Decide) over the run's listing;
// executing the decisions (Execute) deletes each doomed checkpoint's
// metadata object first, so a half-deleted checkpoint is never seen as
// committed, then its data objects in parallel.
//
// gc deletes only what ckptkit wrote: prefixes whose every object has a
// name ckptkit writes (catalog.OwnedObject), committed in a format ckptkit
// writes (native, or the DCP checkpoints of ckptkit.torch.save when the
// torchdcp package is linked: catalog.WrittenFormat) or not committed at
// all. It never deletes the newest valid
// checkpoint, nor anything newer than it, nor an uncommitted prefix
// younger than the grace period (a save may be writing it).
package gc

import (
	"fmt"
	"time"

	"github.com/ckptkit/ckptkit/ckpterr"

	"github.com/ckptkit/ckptkit/catalog"
)

// ErrPolicy reports an invalid retention policy.
var ErrPolicy = ckpterr.New(ckpterr.Usage, "invalid gc policy")

// Policy says which checkpoints to keep. A committed checkpoint older than
// the newest valid one is deleted unless one of KeepLast, KeepEvery or
// OlderThan keeps it.
type Policy struct {
	// KeepLast keeps the newest N committed checkpoints up to and including
	// the newest valid one (N >= 1).
	KeepLast int
	// KeepEvery keeps checkpoints whose step is a multiple of K (0: off).
	KeepEvery int64
	// OlderThan keeps checkpoints younger than this (0: off).
	OlderThan time.Duration
	// Grace protects recent prefixes that may still be being written: an
	// uncommitted prefix, or anything newer than the newest valid
	// checkpoint, is kept while its newest object is younger than Grace.
	Grace time.Duration
}

// Validate checks the policy.
func (p Policy) Validate() error {
	switch {
	case p.KeepLast < 1:
		return fmt.Errorf("%w: keep-last must be at least 1, got %d", ErrPolicy, p.KeepLast)
	case p.KeepEvery < 0:
		return fmt.Errorf("%w: keep-every must not be negative, got %d", ErrPolicy, p.KeepEvery)
	case p.OlderThan < 0 || p.Grace < 0:
		return fmt.Errorf("%w: durations must not be negative", ErrPolicy)
	}
	return nil
}

// Decision is what gc does with one checkpoint prefix, and why.
type Decision struct {
	Entry  catalog.Entry
	Delete bool
	Reason string
}

// Decide applies p to the entries of a run (as catalog.List returns them)
// given the name of the newest valid checkpoint ("" when there is none)
// and the current time. It returns one decision per entry, in entry order.
// It does no I/O.
func Decide(entries []catalog.Entry, newestValid string, p Policy, now time.Time) ([]Decision, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	validStep := int64(-1)
	for _, e := range entries {
		if e.Name == newestValid {
			validStep = e.Step
		}
	}
	if newestValid != "" && validStep < 0 {
		return nil, fmt.Errorf("%w: newest valid checkpoint %q is not in the listing", ErrPolicy, newestValid)
	}
	out := make([]Decision, len(entries))
	kept := 0 // committed checkpoints at or below the newest valid one, newest first
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		d := Decision{Entry: e}
		age := e.Age(now)
		young := func(limit time.Duration) bool { return age < 0 || age < limit }
		ours := e.Committed && catalog.WrittenFormat(e.Format)
		if ours && validStep >= 0 && e.Step <= validStep {
			kept++
		}
		switch {
		case e.Name == newestValid:
			d.Reason = "newest valid checkpoint"
		case e.Unreadable != "":
			d.Reason = "unreadable (storage refuses to read it); kept: " + e.Unreadable
		case e.ForeignObjects > 0:
			d.Reason = fmt.Sprintf("holds %d object(s) ckptkit did not write", e.ForeignObjects)
		case e.Committed && !ours:
			d.Reason = fmt.Sprintf("format %q was not written by ckptkit", e.Format)
		case !e.Committed && young(p.Grace):
			d.Reason = "uncommitted and younger than the grace period: a save may be writing it"
		case !e.Committed:
			d.Delete, d.Reason = true, "abandoned: uncommitted for longer than the grace period"
		case validStep < 0:
			d.Reason = "no valid checkpoint under the run: committed checkpoints are kept"
		case e.Step > validStep && young(p.Grace):
			d.Reason = "newer than the newest valid checkpoint and younger than the grace period"
		case e.Step > validStep:
			d.Reason = "committed but fails verification; kept for inspection"
		case kept <= p.KeepLast:
			d.Reason = fmt.Sprintf("among the last %d", p.KeepLast)
		case p.KeepEvery > 0 && e.Step%p.KeepEvery == 0:
			d.Reason = fmt.Sprintf("step is a multiple of %d", p.KeepEvery)
		case p.OlderThan > 0 && young(p.OlderThan):
			d.Reason = fmt.Sprintf("younger than %s", p.OlderThan)
		default:
			d.Delete, d.Reason = true, "outside the retention policy"
		}
		out[i] = d
	}
	return out, nil
}

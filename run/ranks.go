package run

import (
	"context"
	"encoding/gob"
	"fmt"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/coordinator"
)

// decision is rank 0's choice, broadcast to every rank.
type decision struct {
	Name         string
	Step         int64
	Fresh, Empty bool
	Skipped      []wireSkip
	Err          *coordinator.RemoteError
}

// outcome is one rank's load, gathered from every rank.
type outcome struct {
	Name string
	Step int64
	Err  *coordinator.RemoteError
}

type wireSkip struct {
	Entry  catalog.Entry
	Reason string
	Why    Why
	Err    *coordinator.RemoteError
}

func init() {
	gob.Register(decision{})
	gob.Register(outcome{})
	coordinator.RegisterError("run.ErrNoValidCheckpoint", ErrNoValidCheckpoint)
	coordinator.RegisterError("run.ErrNothingStored", ErrNothingStored)
}

func toWire(ss []Skipped) []wireSkip {
	out := make([]wireSkip, len(ss))
	for i, s := range ss {
		out[i] = wireSkip{Entry: s.Entry, Reason: s.Reason, Why: s.Why, Err: coordinator.ToRemote(s.Err)}
	}
	return out
}

func fromWire(ws []wireSkip) []Skipped {
	out := make([]Skipped, len(ws))
	for i, w := range ws {
		out[i] = Skipped{Skipped: catalog.Skipped{Entry: w.Entry, Reason: w.Reason, Err: coordinator.FromRemote(w.Err)}, Why: w.Why}
	}
	return out
}

// resumeRanks is Resume over several ranks: rank 0 chooses and broadcasts;
// every rank loads, falling back past its own damaged data; the ranks
// gather the steps they loaded and, until they agree, those ahead load the
// oldest one (falling back further if it is damaged for them).
func (r *Run) resumeRanks(ctx context.Context, c coordinator.Coordinator, opts ResumeOptions) (*Resumed, error) {
	var d decision
	var res *Resumed
	var found *Found
	if c.Rank() == 0 {
		var err error
		res, found, err = r.choose(ctx, opts)
		switch {
		case err != nil:
			d.Err = coordinator.ToRemote(err)
		case found != nil:
			d.Name, d.Step, d.Skipped = found.Name, found.Step, toWire(res.Skipped)
		default:
			d.Fresh, d.Empty, d.Skipped = true, res.Empty, toWire(res.Skipped)
		}
		if _, berr := c.Broadcast(ctx, d); berr != nil {
			return nil, berr
		}
		if err != nil {
			return nil, err
		}
	} else {
		v, err := c.Broadcast(ctx, nil)
		if err != nil {
			return nil, err
		}
		var ok bool
		if d, ok = v.(decision); !ok {
			return nil, fmt.Errorf("resume %s: rank 0's choice is a %T", r, v)
		}
		if d.Err != nil {
			return nil, fmt.Errorf("resume %s: rank 0: %w", r, coordinator.FromRemote(d.Err))
		}
		res = &Resumed{Fresh: d.Fresh, Empty: d.Empty, Skipped: fromWire(d.Skipped)}
	}
	if d.Fresh {
		return res, nil
	}
	var l *Loaded
	var err error
	name, step := d.Name, d.Step
	for need := true; ; {
		if need && (found == nil || found.Name != name) {
			found, err = r.found(ctx, name, step)
		}
		if need && err == nil {
			var nl *Loaded
			if nl, err = r.Load(ctx, found, opts.Load, opts.Logf); err == nil {
				if l != nil {
					// Passed over for the older step another rank reached.
					nl.Skipped = append(l.Skipped, nl.Skipped...)
				}
				l = nl
			}
		}
		o := outcome{Err: coordinator.ToRemote(err)}
		if l != nil {
			o.Name, o.Step = l.Entry.Name, l.Entry.Step
		}
		vals, gerr := c.AllGather(ctx, o)
		if gerr != nil {
			return nil, gerr
		}
		if err != nil {
			return nil, err
		}
		agreed := true
		oldest := o
		for rank, v := range vals {
			ov, ok := v.(outcome)
			if !ok {
				return nil, fmt.Errorf("resume %s: rank %d's outcome is a %T", r, rank, v)
			}
			if ov.Err != nil {
				return nil, fmt.Errorf("resume %s: rank %d: %w", r, rank, coordinator.FromRemote(ov.Err))
			}
			if ov.Step != o.Step {
				agreed = false
			}
			if ov.Step < oldest.Step {
				oldest = ov
			}
		}
		if agreed {
			return res.loaded(l), nil
		}
		if oldest.Step < l.Entry.Step {
			e := l.Entry
			l.Skipped = append(l.Skipped, Skipped{Skipped: catalog.Skipped{Entry: e,
				Reason: fmt.Sprintf("another rank could not load it and fell back to %s", oldest.Name)}, Why: OtherRank})
			name, step = oldest.Name, oldest.Step
			found, need = nil, true
		} else {
			need = false // this rank is at the oldest step: it waits for the others
		}
	}
}

// found opens the run's checkpoint name (a step another rank chose).
func (r *Run) found(ctx context.Context, name string, step int64) (*Found, error) {
	ck, err := r.openStep(ctx, name)
	if err != nil {
		return nil, err
	}
	return &Found{Entry: catalog.Entry{Name: name, Step: step, URL: ck.URL(), Committed: true, Format: ck.FormatName()}, Checkpoint: ck}, nil
}

package run

import (
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/ops/gc"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
	"github.com/ckptkit/ckptkit/transfer"
)

// The tiers a resume can take (TierResumed.Tier).
const (
	TierLocal   = "local"
	TierDurable = "durable"
)

// TierOptions tune a Tiered run.
type TierOptions struct {
	// PersistEvery persists a committed local step to the durable run when
	// the step is a multiple of it (0 or 1: every committed step).
	PersistEvery int64
	// NoPersist: this rank never persists (Committed only runs local
	// retention). For replicated state (a plain or DDP model) every rank
	// saves the whole state to its own local tier, and one rank (rank 0)
	// persists it: the durable run then holds one copy, loadable by every
	// rank.
	NoPersist bool
	// LocalKeep is how many committed local steps retention keeps (0: 2).
	// The newest committed local step and the steps being persisted are
	// never deleted.
	LocalKeep int
	// Transfer tunes each persist's copy (Force is always set: a persist
	// replaces a step a previous attempt of the run left in the durable
	// run).
	Transfer transfer.Options
	// Retry: a persist whose copy fails transiently (backend.IsTransient)
	// is copied again, up to Retry.Attempts copies in all, with
	// backend.Backoff between them (zero: backend.DefaultRetryPolicy). The
	// Store retries each request it can replay; a streamed upload it
	// cannot is retried this way, as a whole copy.
	Retry backend.RetryPolicy
}

// Persist is the outcome of one persist of a local step to the durable run.
type Persist struct {
	Step int64
	// Retries counts the copies started again after a transient failure.
	Retries int
	// Result is the copy's result (nil when it failed).
	Result *transfer.Result
	// Err is why it failed (nil when the step is committed in the durable
	// run).
	Err error
}

// Tiered is a run with a node-local tier in front of the durable one: every
// save commits to Local; every PersistEvery-th committed step is then
// copied to Durable in the background (transfer: every byte CRC-checked,
// metadata last), at most one copy in flight, a newer step superseding a
// queued one (never the one in flight). Resume takes the nearest valid copy
// (ResumeTiered). Its methods are safe for concurrent use.
type Tiered struct {
	// Local is the node-local run, Durable the durable one.
	Local, Durable *Run
	opts           TierOptions

	ctx    context.Context // the persists' context, cancelled by Close
	cancel context.CancelFunc

	mu         sync.Mutex
	inflight   int64 // step being persisted, -1: none
	queued     int64 // step waiting for it, -1: none
	superseded int
	ended      []Persist     // persists ended since the last Committed
	all        []Persist     // every persist ended
	idle       chan struct{} // closed when nothing is in flight or queued
}

// NewTiered returns the tiered run of local (the node-local tier) and
// durable. Close ends it.
func NewTiered(local, durable *Run, opts TierOptions) *Tiered {
	ctx, cancel := context.WithCancel(context.Background())
	idle := make(chan struct{})
	close(idle)
	return &Tiered{Local: local, Durable: durable, opts: opts, ctx: ctx, cancel: cancel, inflight: -1, queued: -1, idle: idle}
}

// SaveLocal saves the state of every rank of one process as step's
// checkpoint in the local tier (Run.SaveLocal), then Committed(step). A
// persist that failed since the last save is reported in ended (never
// silently dropped); err is the local save's own failure.
func (t *Tiered) SaveLocal(ctx context.Context, step int64, sds []*statedict.StateDict, opts saver.Options) (res *saver.Result, ended []Persist, err error) {
	res, err = t.Local.SaveLocal(ctx, step, sds, opts)
	if err != nil {
		return nil, nil, err
	}
	ended, err = t.Committed(ctx, step)
	return res, ended, err
}

// Committed tells t that step is committed in the local tier (by a save
// through Local: Save, SaveAsync's handle, ...): when it is due (and the
// rank persists: TierOptions.NoPersist) it is persisted in the background, and local retention runs. It returns the
// persists that ended since the last call, failures included; err is a
// failure of local retention.
func (t *Tiered) Committed(ctx context.Context, step int64) ([]Persist, error) {
	t.mu.Lock()
	if every := t.opts.PersistEvery; !t.opts.NoPersist && (every <= 1 || step%every == 0) {
		t.schedule(step)
	}
	ended := t.ended
	t.ended = nil
	t.mu.Unlock()
	return ended, t.retainLocal(ctx)
}

// schedule starts persisting step, or queues it behind the one in flight
// (superseding a queued one). t.mu is held.
func (t *Tiered) schedule(step int64) {
	if t.inflight >= 0 {
		if t.queued >= 0 {
			t.superseded++
		}
		t.queued = step
		return
	}
	t.inflight = step
	t.idle = make(chan struct{})
	go t.persistLoop(step, t.idle)
}

// persistLoop persists step, then the queued steps, until none is queued.
func (t *Tiered) persistLoop(step int64, idle chan struct{}) {
	for {
		p := t.persist(step)
		t.mu.Lock()
		t.ended = append(t.ended, p)
		t.all = append(t.all, p)
		if t.queued < 0 || t.ctx.Err() != nil {
			t.inflight, t.queued = -1, -1
			close(idle)
			t.mu.Unlock()
			return
		}
		step, t.queued = t.queued, -1
		t.inflight = step
		t.mu.Unlock()
	}
}

// persist copies the local step to the durable run.
func (t *Tiered) persist(step int64) Persist {
	p := Persist{Step: step}
	src, err := t.Local.Step(step)
	if err == nil {
		var dst *backend.Store
		if dst, err = t.Durable.Step(step); err == nil {
			p.Result, err = t.copyRetrying(src, dst, &p.Retries)
		}
	}
	if err != nil {
		p.Err = fmt.Errorf("persist step %d to %s: %w", step, t.Durable, err)
	}
	return p
}

// copyRetrying copies src to dst, again after a transient failure (the
// Retry policy, through backend.Retry), counting the retries in retries.
func (t *Tiered) copyRetrying(src, dst *backend.Store, retries *int) (*transfer.Result, error) {
	pol := t.opts.Retry
	if pol.Attempts < 1 {
		pol = backend.DefaultRetryPolicy
	}
	o := t.opts.Transfer
	o.Force = true
	var res *transfer.Result
	n, err := backend.Retry(t.ctx, pol, func() error {
		var err error
		res, err = transfer.Copy(t.ctx, src, dst, o)
		return err
	})
	*retries += n
	return res, err
}

// Wait waits, for at most grace (0: no bound), until no persist is in
// flight or queued. It returns the persists that ended since the last
// Committed and, when grace ran out, an error naming the step still in
// flight (its copy goes on until Close).
func (t *Tiered) Wait(ctx context.Context, grace time.Duration) ([]Persist, error) {
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	var timeout <-chan time.Time
	if grace > 0 {
		tm := time.NewTimer(grace)
		defer tm.Stop()
		timeout = tm.C
	}
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		t.mu.Lock()
		err = fmt.Errorf("persist of step %d to %s did not end within %s: %w", t.inflight, t.Durable, grace, context.DeadlineExceeded)
		t.mu.Unlock()
	}
	t.mu.Lock()
	ended := t.ended
	t.ended = nil
	t.mu.Unlock()
	return ended, err
}

// Stats are a Tiered run's persist figures.
type Stats struct {
	// Persists are every persist that ended, oldest first.
	Persists []Persist
	// Superseded counts queued steps a newer one replaced before their
	// persist started.
	Superseded int
	// InFlight is the step being persisted (-1: none).
	InFlight int64
}

// Stats returns the persist figures so far.
func (t *Tiered) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{Persists: append([]Persist(nil), t.all...), Superseded: t.superseded, InFlight: t.inflight}
}

// Close waits for the persist in flight (and the queued one) for at most
// grace (<= 0: not at all), then cancels what is left (a cancelled copy
// removes what it wrote, its metadata never written) and waits for it to
// stop. It returns the failures of the persists that ended since the last
// report, and the grace's expiry.
func (t *Tiered) Close(grace time.Duration) error {
	var ended []Persist
	var err error
	if grace > 0 {
		ended, err = t.Wait(context.Background(), grace)
	}
	t.cancel()
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	<-idle
	t.mu.Lock()
	ended = append(ended, t.ended...)
	t.ended = nil
	t.mu.Unlock()
	errs := []error{err}
	for _, p := range ended {
		errs = append(errs, p.Err)
	}
	return errors.Join(errs...)
}

// protected reports the steps local retention must keep: the one in flight
// and the queued one.
func (t *Tiered) protected() map[int64]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return map[int64]bool{t.inflight: true, t.queued: true}
}

// retainLocal keeps the newest LocalKeep committed local steps (gc's
// policy: never the newest valid one), and every step being persisted.
func (t *Tiered) retainLocal(ctx context.Context) error {
	keep := t.opts.LocalKeep
	if keep <= 0 {
		keep = 2
	}
	plan, err := t.Local.PlanRetention(ctx, gc.Policy{KeepLast: keep, Grace: time.Minute}, false, time.Now())
	if err != nil {
		return fmt.Errorf("local retention of %s: %w", t.Local, err)
	}
	keepSteps := t.protected()
	doomed := plan.Decisions[:0]
	for _, d := range plan.Decisions {
		if d.Delete && !keepSteps[d.Entry.Step] {
			doomed = append(doomed, d)
		}
	}
	plan.Decisions, plan.Orphans, plan.Uploads = doomed, nil, nil
	if len(doomed) == 0 {
		return nil
	}
	if _, err := t.Local.Collect(ctx, plan, gc.Options{}); err != nil {
		return fmt.Errorf("local retention of %s: %w", t.Local, err)
	}
	return nil
}

// TierResumed is what ResumeTiered did.
type TierResumed struct {
	*Resumed
	// Tier is the tier resumed from (TierLocal, TierDurable; "" when
	// Fresh), and Why says why it was chosen.
	Tier, Why string
}

// tierInfo is one rank's local tier, gathered from every rank.
type tierInfo struct {
	Local   []int64 // committed local steps, newest first
	Durable int64   // rank 0: the durable run's newest valid step (Latest), -1: none
	Err     *coordinator.RemoteError
}

// tierLoad is one rank's attempt at a local step, gathered.
type tierLoad struct {
	OK     bool
	Reason string
	Err    *coordinator.RemoteError
}

// ResumeTiered resumes from the nearest valid copy: the newest step that
// every rank holds committed in its local tier, when it is at least as new
// as the durable run's newest valid step (Latest: committed, metadata
// verified) and every rank's local copy
// opens, verifies and loads (every byte CRC-checked); a local step any rank
// fails on is skipped by all (the next older one is tried); otherwise every
// rank resumes from the durable run (Run.Resume, its fallback and rank
// agreement). With opts.Coordinator all ranks take the same step from the
// same tier. A local copy that does not open or verify, or whose data
// turns out damaged (DataDamaged), is passed over; any other failure (a
// load rule's refusal, storage refusing to read) is the error.
func (t *Tiered) ResumeTiered(ctx context.Context, opts ResumeOptions) (*TierResumed, error) {
	if opts.Load == nil {
		return nil, fmt.Errorf("resume %s: %w: no Load function", t.Durable, ErrInvalidArgument)
	}
	c := opts.Coordinator
	rank := 0
	if c != nil {
		rank = c.Rank()
	}
	var info tierInfo
	entries, err := catalog.List(ctx, t.Local.Store())
	if ckpterr.ClassOf(err) == ckpterr.NotFound {
		err = nil // a lost node: its local tier is gone
	}
	if err == nil {
		for i := len(entries) - 1; i >= 0; i-- {
			if entries[i].Committed {
				info.Local = append(info.Local, entries[i].Step)
			}
		}
	}
	info.Durable = -1
	if err == nil && rank == 0 {
		found, _, lerr := t.Durable.Latest(ctx, LatestOptions{})
		var refused *RefusedError
		switch {
		case found != nil:
			info.Durable = found.Step
		case lerr != nil && !errors.As(lerr, &refused) && ckpterr.ClassOf(lerr) != ckpterr.NotFound:
			err = lerr // none valid, or nothing stored: local copies may still do
		}
	}
	info.Err = coordinator.ToRemote(err)
	infos, err := gather(ctx, c, info)
	if err != nil {
		return nil, err
	}
	durable := int64(-1)
	common := map[int64]int{}
	for i, v := range infos {
		in, ok := v.(tierInfo)
		if !ok {
			return nil, fmt.Errorf("resume %s: rank %d's local tier is a %T", t.Durable, i, v)
		}
		if in.Err != nil {
			return nil, fmt.Errorf("resume %s: rank %d: %w", t.Durable, i, coordinator.FromRemote(in.Err))
		}
		if i == 0 {
			durable = in.Durable
		}
		for _, s := range in.Local {
			common[s]++
		}
	}
	var candidates []int64 // held by every rank, newest first, not older than durable
	for _, s := range infos[0].(tierInfo).Local {
		if common[s] == len(infos) && s >= durable {
			candidates = append(candidates, s)
		}
	}
	var skipped []Skipped
	why := "no local step held by every rank is as new as the durable run's newest"
	for _, step := range candidates {
		name := catalog.StepName(step)
		var l tierLoad
		var res *Resumed
		found, err := t.Local.found(ctx, name, step)
		skippable := err != nil && openSkippable(err)
		if err == nil {
			r, lerr := opts.Load(ctx, found.Checkpoint)
			if lerr == nil {
				l.OK = true
				res = &Resumed{Checkpoint: found.Checkpoint, Entry: found.Entry, Report: r}
			}
			err, skippable = lerr, DataDamaged(lerr)
		}
		if err != nil {
			l.Reason = err.Error()
			if !skippable {
				l.Err = coordinator.ToRemote(err)
			}
		}
		loads, gerr := gather(ctx, c, l)
		if gerr != nil {
			return nil, gerr
		}
		all := true
		for i, v := range loads {
			lv, ok := v.(tierLoad)
			if !ok {
				return nil, fmt.Errorf("resume %s: rank %d's local load is a %T", t.Durable, i, v)
			}
			if lv.Err != nil {
				return nil, fmt.Errorf("resume %s: rank %d: local %s: %w", t.Durable, i, name, coordinator.FromRemote(lv.Err))
			}
			if !lv.OK && all {
				all = false
				w := Damaged
				if i != rank {
					w = OtherRank
				}
				reason := fmt.Sprintf("local tier of rank %d: %s", i, lv.Reason)
				skipped = append(skipped, Skipped{Skipped: catalog.Skipped{Entry: catalog.Entry{Name: name, Step: step, URL: t.Local.StepURL(step), Committed: true}, Reason: reason}, Why: w})
				if opts.Logf != nil {
					opts.Logf("skipping local %s: %s", name, reason)
				}
			}
		}
		if all {
			res.Skipped = skipped
			return &TierResumed{Resumed: res, Tier: TierLocal, Why: fmt.Sprintf("every rank's local copy of %s verified and loaded", name)}, nil
		}
		why = "no local step every rank could load is as new as the durable run's newest"
	}
	res, err := t.Durable.Resume(ctx, opts)
	if err != nil {
		return nil, err
	}
	if res.Fresh && len(skipped) > 0 {
		return nil, refusal(t.Local.Store(), skipped)
	}
	res.Skipped = append(skipped, res.Skipped...)
	tr := &TierResumed{Resumed: res, Tier: TierDurable, Why: why}
	if res.Fresh {
		tr.Tier, tr.Why = "", "no committed checkpoint in either tier"
	}
	return tr, nil
}

// openSkippable tells a local copy that does not open or verify (a bad,
// missing or uncommitted checkpoint: passed over) from a failure to read
// it at all, which is the resume's error.
func openSkippable(err error) bool {
	switch ckpterr.ClassOf(err) {
	case ckpterr.BadCheckpoint, ckpterr.NotFound:
		return true
	}
	return DataDamaged(err)
}

func init() {
	gob.Register(tierInfo{})
	gob.Register(tierLoad{})
}

// gather is c.AllGather, or v alone without a coordinator of several ranks.
func gather(ctx context.Context, c coordinator.Coordinator, v any) ([]any, error) {
	if c == nil || c.WorldSize() <= 1 {
		return []any{v}, nil
	}
	return c.AllGather(ctx, v)
}

package saver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/statedict"
)

// ErrSaveInFlight is returned by a Saver configured with RefuseWhileBusy
// when a save starts while the previous one has not finished.
var ErrSaveInFlight = ckpterr.New(ckpterr.Conflict, "a save of this saver is still in flight")

// AsyncOptions configure a Saver.
type AsyncOptions struct {
	// StagingBytes bounds the host memory the saver's staging holds at any
	// moment (0: DefaultStagingBytes; at least MinStagingBytes). A state
	// larger than the budget is staged in pieces as uploads drain them.
	StagingBytes int64
	// RefuseWhileBusy makes a save that starts while the previous one is in
	// flight fail with ErrSaveInFlight; by default it waits for it.
	RefuseWhileBusy bool
	// Prefault maps and touches the whole staging pool in NewSaver, so that
	// no save, the first one included, takes a page fault while it copies
	// (the pool then holds StagingBytes of memory from the start). By
	// default the pool's pages are faulted in by the first saves that use
	// them.
	Prefault bool
	// Overlap makes SaveAsync and SaveLocalAsync return once the save is
	// planned (every rank agreed on the plan), not once it is staged: the
	// copy of the state into the pool then runs in the background, within
	// the same budget, while the caller computes (the next step's forward
	// and backward pass). The caller must not modify the state's buffers
	// until the handle's Staged channel is closed (WaitStaged); a staging
	// failure surfaces on Wait and on the next save, like an upload
	// failure, and cancelling the save's context aborts staging too.
	Overlap bool
}

// A Saver runs asynchronous saves: SaveAsync returns once the state is
// staged (copied out of the caller's buffers into the saver's pool), the
// data objects are written in the background, and the metadata is
// committed last, by the same algorithm as Save. At most one save is in
// flight per Saver. The staging pool is reused from save to save. A Saver
// is safe for concurrent use; create one per process (or per rank of a
// multi-process job) and keep it for the whole run.
type Saver struct {
	stg     *stager
	refuse  bool
	overlap bool

	mu      sync.Mutex
	cur     *Handle // the newest save; nil before the first
	pending error   // a failure of cur not yet returned by a save call
}

// NewSaver returns a Saver with the given staging budget.
func NewSaver(opts AsyncOptions) (*Saver, error) {
	budget := opts.StagingBytes
	if budget == 0 {
		budget = DefaultStagingBytes
	}
	if budget < MinStagingBytes {
		return nil, ckpterr.WithClass(fmt.Errorf("saver: staging budget %d bytes is below the minimum of %d", budget, MinStagingBytes), ckpterr.Usage)
	}
	stg, err := newStager(budget, opts.Prefault)
	if err != nil {
		return nil, err
	}
	return &Saver{stg: stg, refuse: opts.RefuseWhileBusy, overlap: opts.Overlap}, nil
}

// State is where an asynchronous save stands.
type State int32

// The states of a Handle, in order; Committed and Failed are final.
const (
	// Staging: the save still reads the caller's buffers.
	Staging State = iota
	// Staged: the caller's buffers are free; objects are being written.
	Staged
	// Committed: the metadata is written; the checkpoint is valid.
	Committed
	// Failed: the save ended without committing.
	Failed
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Staging:
		return "staging"
	case Staged:
		return "staged"
	case Committed:
		return "committed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Handle is one asynchronous save.
type Handle struct {
	state   atomic.Int32
	planned chan struct{} // closed once planned, or once the save is final
	plan    sync.Once
	// plannedOK is set (before planned is closed) when every rank got the
	// plan: a failure after that is not the starting call's to return.
	plannedOK atomic.Bool
	staged    chan struct{}
	done      chan struct{}
	start     time.Time
	stall     time.Duration // set before SaveAsync returns the handle
	waited    time.Duration // the part of stall spent waiting for the previous save
	// stagedAt is when the caller's buffers were freed (written before
	// staged is closed).
	stagedAt time.Time
	res      *Result
	err      error
	end      time.Time
	gate     *uploadGate // opened once staged
}

func newHandle(start time.Time) *Handle {
	return &Handle{planned: make(chan struct{}), staged: make(chan struct{}), done: make(chan struct{}), start: start, gate: newUploadGate()}
}

// markPlanned is called once every rank has the save's plan, and again
// (a no-op then) once the save is final, so that a save failing before
// its plan still releases SaveAsync, after its outcome is set.
func (h *Handle) markPlanned() { h.plan.Do(func() { close(h.planned) }) }

// planHook is the save's planned hook: the plan reached every rank.
func (h *Handle) planHook() {
	h.plannedOK.Store(true)
	h.markPlanned()
}

func (h *Handle) markStaged() {
	h.state.CompareAndSwap(int32(Staging), int32(Staged))
	h.stagedAt = time.Now()
	close(h.staged)
	h.gate.open()
}

func (h *Handle) finish(res *Result, err error) {
	h.res, h.err, h.end = res, err, time.Now()
	if err != nil {
		h.state.Store(int32(Failed))
	} else {
		h.state.Store(int32(Committed))
	}
	close(h.done)
}

// State reports where the save stands now.
func (h *Handle) State() State { return State(h.state.Load()) }

// Staged is closed once the caller's buffers are no longer read.
func (h *Handle) Staged() <-chan struct{} { return h.staged }

// WaitStaged waits until the caller's buffers are no longer read (Staged),
// or returns ctx's error if ctx ends first. With AsyncOptions.Overlap the
// caller calls it before modifying the saved state (right before its
// optimizer step); whether the save then succeeds is Wait's answer.
func (h *Handle) WaitStaged(ctx context.Context) error {
	select {
	case <-h.staged:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("saver: wait for staging: %w", ctx.Err())
	}
}

// Done is closed once the save has committed or failed.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait waits for the save to commit or fail and returns its outcome, or
// ctx's error if ctx ends first (the save goes on).
func (h *Handle) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-h.done:
		return h.res, h.err
	case <-ctx.Done():
		return nil, fmt.Errorf("saver: wait: %w", ctx.Err())
	}
}

// Stall is how long the call that started the save blocked its caller:
// waiting for the previous save, planning and (unless
// AsyncOptions.Overlap) staging.
func (h *Handle) Stall() time.Duration { return h.stall }

// Waited is the part of Stall spent waiting for the previous save to
// commit (the rest is planning and staging).
func (h *Handle) Waited() time.Duration { return h.waited }

// Staging is how long the save read the caller's buffers: from the end of
// the wait for the previous save (Waited) to Staged, so planning and the
// copy into the pool; 0 while Staged is not closed yet. With
// AsyncOptions.Overlap most of it ran while the caller computed.
func (h *Handle) Staging() time.Duration {
	select {
	case <-h.staged:
		return h.stagedAt.Sub(h.start) - h.waited
	default:
		return 0
	}
}

// Elapsed is the save's wall time from its start to its commit or failure
// (up to now while it runs).
func (h *Handle) Elapsed() time.Duration {
	select {
	case <-h.done:
		return h.end.Sub(h.start)
	default:
		return time.Since(h.start)
	}
}

// SaveAsync is one rank's part of a collective asynchronous save: every
// rank of c calls it (with its own Saver when ranks are processes). It
// returns once this rank's state is staged, after which the caller may
// modify sd's buffers (with AsyncOptions.Overlap: once the save is
// planned, and the caller waits for Staged before modifying them); the save goes on in the background under ctx (which
// must outlive it: cancelling ctx aborts it, uncommitted). If the previous
// save of s failed, SaveAsync returns that failure instead of starting.
// A save that fails before it is staged (with AsyncOptions.Overlap: before
// it is planned) returns its error too (the handle is then final); with
// Overlap a later failure, however soon, is Wait's and the next save's.
func (s *Saver) SaveAsync(ctx context.Context, st *backend.Store, c coordinator.Coordinator, sd *statedict.StateDict, opts Options) (*Handle, error) {
	return s.start(ctx, func(h *Handle, stg *staging) (*Result, error) {
		return save(ctx, st, c, sd, opts, stg, hooks{planned: h.planHook, staged: h.markStaged})
	})
}

// SaveLocalAsync is SaveAsync for len(sds) ranks running as goroutines of
// this process (like SaveLocal): it returns once every rank is staged.
func (s *Saver) SaveLocalAsync(ctx context.Context, st *backend.Store, sds []*statedict.StateDict, opts Options) (*Handle, error) {
	return s.start(ctx, func(h *Handle, stg *staging) (*Result, error) {
		return saveRanks(ctx, st, sds, opts, stg, hooks{planned: h.planHook, staged: h.markStaged})
	})
}

func (s *Saver) start(ctx context.Context, run func(h *Handle, stg *staging) (*Result, error)) (*Handle, error) {
	t0 := time.Now()
	h := newHandle(t0)
	if err := s.waitIdle(ctx, h); err != nil {
		return nil, err
	}
	h.waited = time.Since(t0)
	stg := &staging{pool: s.stg, gate: h.gate}
	go func() {
		res, err := run(h, stg)
		s.mu.Lock()
		h.finish(res, err)
		if err != nil {
			s.pending = err
		}
		s.mu.Unlock()
		h.markPlanned()
	}()
	if s.overlap {
		<-h.planned
	} else {
		<-h.staged
	}
	h.stall = time.Since(t0)
	if s.overlap && h.plannedOK.Load() {
		// Planned: whatever happens from here on (staging included) is
		// Wait's and the next save's to report, never this call's, even
		// if the save has already failed by now.
		return h, nil
	}
	select {
	case <-h.done:
		if h.err != nil {
			s.mu.Lock()
			if s.pending == h.err {
				s.pending = nil // returned here, not again by the next save
			}
			s.mu.Unlock()
			return h, h.err
		}
	default:
	}
	return h, nil
}

// waitIdle waits for the save in flight (or refuses), then returns the
// failure of the previous save if no save call returned it yet. With next
// non-nil it also makes next the save in flight, in the same critical
// section that found the saver idle, so two concurrent saves never both
// start.
func (s *Saver) waitIdle(ctx context.Context, next *Handle) error {
	for {
		s.mu.Lock()
		cur := s.cur
		busy := false
		if cur != nil {
			select {
			case <-cur.done:
			default:
				busy = true
			}
		}
		if !busy {
			defer s.mu.Unlock()
			if err := s.pending; err != nil {
				s.pending = nil
				return fmt.Errorf("saver: the previous save failed: %w", err)
			}
			if next != nil {
				s.cur = next
			}
			return nil
		}
		s.mu.Unlock()
		if s.refuse {
			return fmt.Errorf("saver: %w (started %s ago)", ErrSaveInFlight, time.Since(cur.start).Round(time.Millisecond))
		}
		select {
		case <-cur.done:
		case <-ctx.Done():
			return fmt.Errorf("saver: waiting for the previous save: %w", ctx.Err())
		}
	}
}

// Wait waits for the save in flight, if any, and returns the outcome of
// the newest save (nil, nil before the first). It is Handle.Wait of the
// newest handle.
func (s *Saver) Wait(ctx context.Context) (*Result, error) {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur == nil {
		return nil, nil
	}
	return cur.Wait(ctx)
}

// Stats describes a Saver's staging memory.
type Stats struct {
	// BudgetBytes is the staging budget (rounded down to whole pages).
	BudgetBytes int64
	// PoolBytes is the memory of the pool's pages handed out at least once
	// since the pool was mapped, held or free (the whole budget with
	// AsyncOptions.Prefault); 0 after Close.
	PoolBytes int64
	// HeldBytes is the memory staged objects hold right now.
	HeldBytes int64
	// PeakBytes is the largest HeldBytes since the Saver was created.
	PeakBytes int64
}

// Stats returns the saver's staging figures.
func (s *Saver) Stats() Stats {
	return Stats{BudgetBytes: s.stg.budget, PoolBytes: s.stg.allocated.Load(), HeldBytes: s.stg.held.Load(), PeakBytes: s.stg.peak.Load()}
}

// Close waits for the save in flight (returning its failure if no save
// call returned it yet) and returns the staging pool's memory to the
// operating system; the Saver stays usable and maps a new pool on its next
// save. If ctx ends first (or the Saver refuses to wait), the save goes
// on and keeps the pool.
func (s *Saver) Close(ctx context.Context) error {
	err := s.waitIdle(ctx, nil)
	if s.inFlight() != nil {
		return err
	}
	return errors.Join(err, s.stg.drop())
}

// inFlight returns the newest save if it has not finished, else nil.
func (s *Saver) inFlight() *Handle {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur == nil {
		return nil
	}
	select {
	case <-cur.done:
		return nil
	default:
		return cur
	}
}

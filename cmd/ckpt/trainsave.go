package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/trainer"
	ckrun "github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
)

// The --async modes.
const (
	asyncOverlap  = "overlap"
	asyncBlocking = "blocking"
)

// checkpointer is how `ckpt train` saves: synchronously, or (--async)
// through a saver.Saver whose saves overlap the next steps (with
// --async=overlap their staging too). It keeps the figures of --json: save
// wall time, time the loop was blocked, the waits for staging and for the
// last save, step times, staging peak.
type checkpointer struct {
	run     *backend.Store // where saves commit: RUN_URL, or the --local tier
	tiered  *ckrun.Tiered  // --local: persists to RUN_URL; nil without
	f       trainFlags
	async   *saver.Saver // nil: synchronous saves
	logf    func(format string, a ...any)
	options func(step int64) saver.Options

	inflight       *saver.Handle
	inflightStep   int64
	inflightCancel context.CancelFunc

	lastCommitted int64 // step of the newest committed checkpoint, -1 before
	saveTime      time.Duration
	stall         time.Duration // the loop blocked by saves (stagingWait included)
	stagingWait   time.Duration // waits for staging before an optimizer update
	finalWait     time.Duration // the wait for the last save at the end
	steps         stepClock
	checkpoints   []string
}

func newCheckpointer(run *backend.Store, tiered *ckrun.Tiered, f trainFlags, stagingBytes int64, options func(int64) saver.Options, logf func(string, ...any)) (*checkpointer, error) {
	c := &checkpointer{run: run, tiered: tiered, f: f, logf: logf, options: options, lastCommitted: -1, checkpoints: []string{}}
	if f.async {
		s, err := saver.NewSaver(saver.AsyncOptions{StagingBytes: stagingBytes, Overlap: f.asyncMode == asyncOverlap, Prefault: f.prefault})
		if err != nil {
			return nil, usage(err)
		}
		c.async = s
	}
	return c, nil
}

// save checkpoints tr's current step: synchronously, or by starting an
// async save (after the previous one committed) that reads tr's memory
// until it returns (--async=blocking) or until it is staged (overlap; see
// step).
func (c *checkpointer) save(ctx context.Context, tr *trainer.Trainer) error {
	if c.async == nil {
		return c.saveSync(ctx, tr)
	}
	step := tr.Iteration()
	sds := tr.StateViews(c.f.ranks, !c.f.noSaveOptim)
	t0 := time.Now()
	if c.inflight != nil {
		// SaveLocalAsync would wait for it too; waiting here first lets the
		// previous save be accounted for (and its error said) by name.
		if err := c.collect(ctx); err != nil {
			c.stall += time.Since(t0)
			return err
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	r := ckrun.New(c.run)
	h, err := r.SaveLocalAsync(sctx, c.async, step, sds, c.options(step))
	c.stall += time.Since(t0)
	if err != nil {
		cancel()
		return err
	}
	c.inflight, c.inflightStep, c.inflightCancel = h, step, cancel
	verb := "staged"
	if c.f.asyncMode == asyncOverlap {
		verb = "staging"
	}
	c.logf("step %d loss %.6f lr %g: %s %s (stall %s)", step, tr.Loss(), tr.LR(), verb, r.StepURL(step), h.Stall().Round(time.Millisecond))
	return nil
}

// staging reports whether the in-flight save still reads tr's memory.
func (c *checkpointer) staging() bool {
	if c.inflight == nil {
		return false
	}
	select {
	case <-c.inflight.Staged():
		return false
	default:
		return true
	}
}

// step runs one training step around the in-flight save: forward and
// backward (which only read the saved state) while it may still be
// staging, then a wait for staging, then the optimizer update. It records
// the step's compute time, apart for steps that overlapped staging.
func (c *checkpointer) step(ctx context.Context, tr *trainer.Trainer) (float32, error) {
	overlapped := c.staging()
	t0 := time.Now()
	tr.Backward()
	compute := time.Since(t0)
	if overlapped {
		t1 := time.Now()
		err := c.inflight.WaitStaged(ctx)
		waited := time.Since(t1)
		c.stagingWait += waited
		c.stall += waited
		if err != nil {
			return 0, err
		}
	}
	t2 := time.Now()
	loss := tr.Update()
	c.steps.add(overlapped, compute+time.Since(t2))
	return loss, nil
}

// saveSync saves tr's current step and returns once it is committed.
func (c *checkpointer) saveSync(ctx context.Context, tr *trainer.Trainer) error {
	step := tr.Iteration()
	t0 := time.Now()
	sr, err := ckrun.New(c.run).SaveLocal(ctx, step, tr.StateViews(c.f.ranks, !c.f.noSaveOptim), c.options(step))
	c.stall += time.Since(t0)
	if err != nil {
		return err
	}
	c.saveTime += sr.Duration
	c.committed(ctx, step, sr)
	c.logf("step %d loss %.6f lr %g: saved %s (%d bytes, %d objects, %s)", step, tr.Loss(), tr.LR(), sr.URL, sr.BytesWritten, len(sr.Metadata.Objects), sr.Duration.Round(time.Millisecond))
	return nil
}

// poll records the in-flight save's outcome if it has ended (a failure
// ends the training now rather than at the next save).
func (c *checkpointer) poll(ctx context.Context) error {
	if c.inflight == nil {
		return nil
	}
	select {
	case <-c.inflight.Done():
		return c.collect(ctx)
	default:
		return nil
	}
}

// collect waits for the in-flight save and records its outcome.
func (c *checkpointer) collect(ctx context.Context) error {
	h, step := c.inflight, c.inflightStep
	if h == nil {
		return nil
	}
	sr, err := h.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		return err // the save goes on; the caller is aborting
	}
	c.inflight = nil
	c.inflightCancel()
	c.saveTime += h.Elapsed()
	if err != nil {
		return fmt.Errorf("async save of step %d: %w", step, err)
	}
	c.committed(ctx, step, sr)
	c.logf("step %d: committed %s (%d bytes, %d objects, %s)", step, sr.URL, sr.BytesWritten, len(sr.Metadata.Objects), h.Elapsed().Round(time.Millisecond))
	return nil
}

func (c *checkpointer) committed(ctx context.Context, step int64, sr *saver.Result) {
	c.lastCommitted = step
	c.checkpoints = append(c.checkpoints, sr.URL)
	if c.tiered != nil {
		ended, err := c.tiered.Committed(ctx, step)
		c.persisted(ended)
		if err != nil {
			c.logf("%v", err)
		}
	}
}

// finish waits for the in-flight save at the end of training (the job
// cannot end before its checkpoint), counted as finalWait, not as stall:
// it would make the stall of any mode at least one save in 1/saves.
func (c *checkpointer) finish(ctx context.Context) error {
	t0 := time.Now()
	defer func() { c.finalWait += time.Since(t0) }()
	if err := c.collect(ctx); err != nil {
		return err
	}
	return c.waitPersist(ctx, c.f.preemptGrace)
}

// preempt is the first signal's path: let the in-flight save commit within
// grace (abandoning it, uncommitted, past that), then save the current step
// synchronously unless it is the one just committed. It returns the URL of
// the current step's checkpoint.
func (c *checkpointer) preempt(ctx context.Context, tr *trainer.Trainer, grace time.Duration) (string, error) {
	t0 := time.Now()
	if c.inflight != nil {
		gctx, cancel := context.WithTimeout(ctx, grace)
		err := c.collect(gctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case c.inflight != nil: // grace ran out
			c.logf("the save of step %d did not commit within --preempt-grace %s: abandoned, uncommitted", c.inflightStep, grace)
			c.inflightCancel()
			_ = c.collect(ctx) // returns promptly once cancelled
		case err != nil:
			c.logf("%v", err)
		}
	}
	c.stall += time.Since(t0)
	step := tr.Iteration()
	if c.lastCommitted != step {
		if err := c.saveSync(ctx, tr); err != nil {
			return "", err
		}
	}
	// The in-flight persist may end within what is left of grace.
	if err := c.waitPersist(ctx, max(grace-time.Since(t0), time.Millisecond)); err != nil {
		c.logf("%v", err)
	}
	return c.checkpoints[len(c.checkpoints)-1], nil
}

// stagingPeak is the async saver's staging high-water mark (0 when sync).
func (c *checkpointer) stagingPeak() int64 {
	if c.async == nil {
		return 0
	}
	return c.async.Stats().PeakBytes
}

// stepClock collects step compute times, apart for the steps that ran while
// a save was staging.
type stepClock struct {
	overlapped, other []time.Duration
}

func (s *stepClock) add(overlapped bool, d time.Duration) {
	if overlapped {
		s.overlapped = append(s.overlapped, d)
	} else {
		s.other = append(s.other, d)
	}
}

// stepTimes is the "step_times" object of `ckpt train --json`.
type stepTimes struct {
	// OverlappedSteps ran their forward and backward pass while a save was
	// staging; OverlappedMedianSeconds is the median of their compute time
	// (forward, backward, update; not the wait for staging).
	OverlappedSteps         int     `json:"overlapped_steps"`
	OverlappedMedianSeconds float64 `json:"overlapped_median_seconds"`
	// OtherSteps and OtherMedianSeconds: the same for the other steps.
	OtherSteps         int     `json:"other_steps"`
	OtherMedianSeconds float64 `json:"other_median_seconds"`
}

func (s *stepClock) summary() stepTimes {
	return stepTimes{
		OverlappedSteps: len(s.overlapped), OverlappedMedianSeconds: median(s.overlapped),
		OtherSteps: len(s.other), OtherMedianSeconds: median(s.other),
	}
}

// median returns the median of ds in seconds (0 for none).
func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + m) / 2
	}
	return m.Seconds()
}

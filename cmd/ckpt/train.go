package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/internal/bytesize"
	"github.com/ckptkit/ckptkit/internal/trainer"
	"github.com/ckptkit/ckptkit/loader"
	ckrun "github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

type trainFlags struct {
	url         string
	steps       int64
	saveEvery   int64
	ranks       int
	resume      bool
	allowFresh  bool
	seed        uint64
	json        bool
	noSaveOptim bool
	noLoadOptim bool
	force       bool
	// Async saves and preemption (trainsave.go, preempt.go).
	async        bool   // --async given: saves through a saver.Saver
	asyncMode    string // "", asyncOverlap or asyncBlocking
	prefault     bool   // fault the staging pool in when the saver is made
	stateSize    string
	stagingBytes string
	preemptGrace time.Duration
	// The local tier (--local; tier.go).
	local        string
	persistEvery int64
	localKeep    int
}

// trainResult is the final JSON object of `ckpt train --json`.
type trainResult struct {
	header
	URL                 string   `json:"url"`
	Step                int64    `json:"step"`
	Loss                float32  `json:"loss,omitempty"` // absent when no step ran
	LR                  float64  `json:"lr"`
	ResumedFrom         *int64   `json:"resumed_from"`
	ResumedURL          string   `json:"resumed_url,omitempty"`
	WeightsSHA256       string   `json:"weights_sha256"`
	PrunedOptimizerKeys int      `json:"pruned_optimizer_keys"`
	OptimizerLoaded     bool     `json:"optimizer_loaded"`
	Ranks               int      `json:"ranks"`
	Checkpoints         []string `json:"checkpoints"`
	SaveSeconds         float64  `json:"save_seconds"`
	SaveStallSeconds    float64  `json:"save_stall_seconds"`
	// StagingWaitSeconds is the part of SaveStallSeconds spent waiting, before
	// an optimizer update, for an overlapped save to finish staging.
	StagingWaitSeconds float64 `json:"staging_wait_seconds"`
	// FinalWaitSeconds is the wait for the last save to commit at the end of
	// the run (not counted in SaveStallSeconds).
	FinalWaitSeconds float64 `json:"final_wait_seconds"`
	// StepTimes: median compute time of the steps that ran while a save was
	// staging and of the others (the cost of overlap).
	StepTimes        stepTimes `json:"step_times"`
	StagingPeakBytes int64     `json:"staging_peak_bytes"`
	StateBytes       int64     `json:"state_bytes"`
	Preempted        string    `json:"preempted,omitempty"`
	// Tier is the tier --resume took with --local ("local", "durable"),
	// TierWhy why; Persist the persists to RUN_URL (--local only).
	Tier    string         `json:"tier,omitempty"`
	TierWhy string         `json:"tier_why,omitempty"`
	Persist *persistReport `json:"persist,omitempty"`
	// Note says why nothing was trained (a --resume at or past --steps).
	Note string `json:"note,omitempty"`
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train [RUN_URL] --steps N --save-every K [--ranks R] [--resume [--allow-fresh] | --force] [--async[=blocking]] [--state-size SIZE] [--local LOCAL [--persist-every M] [--local-keep N]]",
		Short: "Train a small MLP with a mixture of experts, checkpointing every K steps under URL/step-NNNNNNNN/",
		Long: `Train a small model in pure Go (an MLP with two experts; expert 1 gets no
token before step 8, so early checkpoints have lazily-absent optimizer state),
with parameters and AdamW state sharded over R simulated ranks. A checkpoint
is written to URL/step-<8-digit step>/ every K steps. --resume continues from
the newest committed, valid checkpoint under URL up to step N (N is always the
total step count). The same seed gives the same weights_sha256 for any R and
any mix of interruption and resume, sync or async.

--state-size adds a ballast parameter (trained on an L2 penalty, so it and
its AdamW state change at every step) that makes the checkpoint about SIZE.
--async saves in the background through a staging pool of at most
--staging-bytes (a larger state is staged in pieces as the writes drain
them); a save waits for the previous one to commit. --async (=overlap)
returns once the save is planned: the copy into the pool runs during the
next step's forward and backward pass, and the loop waits for it only
before that step's optimizer update. --async=blocking blocks the loop
while the state is copied.

SIGTERM or SIGINT: the step under way finishes, the in-flight save may
commit (for at most --preempt-grace), the current step is saved
synchronously, its URL is printed and ckpt exits 143 (SIGTERM) or 130
(SIGINT). A second signal aborts at once; nothing half-written is ever
committed.

--local LOCAL adds a node-local tier: every save commits to LOCAL, and every
saved step that is a multiple of --persist-every (0: every save) is copied to
RUN_URL in the background (CRC-checked, metadata last, one copy in flight, a
newer step superseding a queued one); LOCAL keeps --local-keep steps. The run
waits for the in-flight copy at its end and on a signal (bounded by
--preempt-grace); a failed copy is said, counted in --json ("persist") and
fails the run. --resume with --local takes the nearest valid tier: the newest
local step when it verifies and loads and is at least as new as RUN_URL's
newest, else RUN_URL; --json says which ("tier", "tier_why"). See
docs/TIERS.md.

RUN_URL defaults to ./runs/demo (--url is an alias of the argument). A run
that already holds checkpoints is refused (exit 6, conflict) unless
--resume (continue it) or --force (replace the steps this run saves).
--resume into a run already at or past --steps trains nothing and says so.
Progress (steps done / total, rate, ETA) is shown on a terminal.`,
		Example: `  ckpt train ./runs/demo --steps 12 --save-every 3 --ranks 4
  ckpt train ./runs/demo --steps 24 --save-every 3 --resume
  ckpt train s3://bucket/runs/demo --steps 100 --save-every 10 --async --state-size 1GiB --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := trainURL(cmd, args, f.url)
			if err != nil {
				return err
			}
			f.url = u
			return runTrain(cmd.Context(), cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.url, "url", "./runs/demo", "run URL or local path (alias of the RUN_URL argument)")
	fl.BoolVar(&f.force, forceFlag, false, "train from step 0 into a run that holds checkpoints, replacing the steps this run saves")
	fl.Int64Var(&f.steps, "steps", 12, "total number of training steps")
	fl.Int64Var(&f.saveEvery, "save-every", 3, "save a checkpoint every K steps (0: never)")
	fl.IntVar(&f.ranks, "ranks", 1, "number of simulated ranks the state is sharded over")
	fl.BoolVar(&f.resume, "resume", false, "continue from the newest committed, valid checkpoint under RUN_URL")
	fl.BoolVar(&f.allowFresh, "allow-fresh", false, "with --resume: start from step 0 when nothing is stored under RUN_URL (without it that exits 3: a mistyped URL must not start a new run)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the model, the data and the teacher")
	fl.BoolVar(&f.json, "json", false, jsonHelp)
	fl.BoolVar(&f.noSaveOptim, "no-save-optim", false, "do not save optimizer state (iteration and scheduler are still saved)")
	fl.BoolVar(&f.noLoadOptim, "no-load-optim", false, "do not load optimizer state on resume (iteration and scheduler are still restored)")
	fl.StringVar(&f.asyncMode, "async", "", "save in the background, within the --staging-bytes budget: overlap (a bare --async: staging overlaps the next step's forward and backward) or blocking (the loop waits while the state is staged)")
	fl.Lookup("async").NoOptDefVal = asyncOverlap
	fl.StringVar(&f.stateSize, "state-size", "0", "scale the checkpoint to about SIZE (e.g. 1GiB) with a ballast parameter; "+bytesize.Rule)
	fl.BoolVar(&f.prefault, "prefault", true, "with --async: fault the whole --staging-bytes pool in at the start (its memory is held from then on), so no save pays page faults while it stages")
	fl.StringVar(&f.stagingBytes, "staging-bytes", "512MiB", "host memory an --async save may stage at once; "+bytesize.Rule)
	fl.StringVar(&f.local, "local", "", "node-local tier (e.g. /dev/shm/run): every save commits there and every --persist-every-th step is copied to RUN_URL in the background; --resume takes the nearest valid tier")
	fl.Int64Var(&f.persistEvery, "persist-every", 0, "with --local: persist the saved steps that are a multiple of M to RUN_URL (0: every save)")
	fl.IntVar(&f.localKeep, "local-keep", 2, "with --local: committed steps kept in the local tier (never the newest, nor one being persisted)")
	fl.DurationVar(&f.preemptGrace, "preempt-grace", 30*time.Second, "on SIGTERM/SIGINT, how long the in-flight save may take to commit")
	return cmd
}

func runTrain(ctx context.Context, cmd *cobra.Command, f trainFlags) error {
	if f.steps < 0 || f.saveEvery < 0 || f.ranks < 1 {
		return usage(fmt.Errorf("--steps and --save-every must be >= 0 and --ranks >= 1"))
	}
	stateSize, err := bytesize.Parse(f.stateSize)
	if err != nil {
		return usage(fmt.Errorf("--state-size: %w", err))
	}
	stagingBytes, err := bytesize.Parse(f.stagingBytes)
	if err != nil {
		return usage(fmt.Errorf("--staging-bytes: %w", err))
	}
	switch f.asyncMode {
	case "":
	case asyncOverlap, asyncBlocking:
		f.async = true
	default:
		return usage(fmt.Errorf("--async=%s: want overlap (a bare --async) or blocking", f.asyncMode))
	}
	if f.resume && f.force {
		return usage(fmt.Errorf("--resume and --force exclude each other: --resume continues the run, --force replaces its checkpoints"))
	}
	store, err := openStore(ctx, f.url)
	if err != nil {
		return err
	}
	defer store.Close()
	tiered, saveTo, err := openTiers(ctx, store, f)
	if err != nil {
		return err
	}
	if tiered != nil {
		defer saveTo.Close()
		// The end and the preemption paths waited for the persist, bounded
		// by --preempt-grace; what is left (an abort) is cancelled.
		defer tiered.Close(0)
	}
	if !f.resume && !f.force {
		if err := refuseFreshTrainInto(ctx, store); err != nil {
			return err
		}
	}
	logf := func(format string, a ...any) {
		if !f.json {
			inv(cmd).notef(format, a...)
		}
	}
	tr := trainer.NewSized(f.seed, stateSize)
	res := &trainResult{URL: store.String(), Ranks: f.ranks, Checkpoints: []string{}, OptimizerLoaded: true}

	if f.resume {
		withOptim := !f.noLoadOptim
		var targets []*statedict.StateDict
		resumed, err := resumeRun(ctx, store, tiered, f, logf, ckrun.Into(func() []*statedict.StateDict {
			targets = tr.LoadTargets(f.ranks, withOptim)
			return targets
		}, loader.Options{NoLoadOptimizer: f.noLoadOptim}))
		if err != nil {
			return err
		}
		if resumed.Fresh {
			logf("fresh start: no committed checkpoint under %s; starting from step 0", store)
		} else {
			c, rep := resumed.Checkpoint, resumed.Report
			if err := tr.Restore(targets, rep.Iteration, rep.LazyParams, rep.OptimizerLoaded); err != nil {
				return bad(fmt.Errorf("resume from %s: %w", c.URL(), err))
			}
			step := rep.Iteration
			res.ResumedFrom, res.ResumedURL = &step, c.URL()
			res.Tier, res.TierWhy = resumed.Tier, resumed.Why
			res.PrunedOptimizerKeys = rep.LazyKeys
			res.OptimizerLoaded = rep.OptimizerLoaded
			logf("resumed from %s at step %d (%d lazily-absent optimizer keys left fresh)", c.URL(), step, rep.LazyKeys)
			if step >= f.steps {
				return resumedPastTarget(cmd, f, res, tr)
			}
		}
	}

	ckp, err := newCheckpointer(saveTo, tiered, f, stagingBytes, func(step int64) saver.Options {
		return saver.Options{Iteration: step, NoSaveOptimizer: f.noSaveOptim, Overwrite: true, Params: tr.Trainable()}
	}, logf)
	if err != nil {
		return err
	}
	p := newItemProgress(cmd, "train", "steps")
	loopErr := trainLoop(ctx, f, tr, ckp, res, logf, p)
	p.finish()
	res.Checkpoints = ckp.checkpoints
	res.SaveSeconds = ckp.saveTime.Seconds()
	res.SaveStallSeconds = ckp.stall.Seconds()
	res.StagingWaitSeconds = ckp.stagingWait.Seconds()
	res.FinalWaitSeconds = ckp.finalWait.Seconds()
	res.StepTimes = ckp.steps.summary()
	res.StagingPeakBytes = ckp.stagingPeak()
	res.Persist = ckp.persistReport()
	// A preempted run still reports (its error, printed by run, says where
	// the current step was saved).
	var pe *preemptedError
	if errors.As(loopErr, &pe) {
		res.Preempted = signalName(pe.sig)
	} else if loopErr != nil {
		return loopErr
	}
	if loopErr == nil && res.Persist != nil && res.Persist.Failed > 0 {
		// Reported in --json and on stderr, and the exit status.
		loopErr = fmt.Errorf("%d persist(s) to %s failed; the local tier %s holds the steps; the last: %w", res.Persist.Failed, store, f.local, ckp.lastPersistErr())
	}
	res.Step = tr.Iteration()
	if res.Loss == 0 {
		res.Loss = tr.Loss()
	}
	res.LR = tr.LR()
	res.WeightsSHA256 = tr.WeightsSHA256()
	for _, sd := range tr.StateViews(1, !f.noSaveOptim) {
		for _, t := range sd.Tensors {
			res.StateBytes += int64(len(t.Data))
		}
	}
	if f.json {
		emit(cmd, res)
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "step %d loss %.6f lr %g weights_sha256 %s\n", res.Step, res.Loss, res.LR, res.WeightsSHA256)
	}
	return loopErr
}

// trainLoop trains up to --steps, saving every --save-every steps through
// ckp; on SIGTERM/SIGINT it stops after the step under way and returns a
// *preemptedError once the current step is saved (see preempt.go).
func trainLoop(ctx context.Context, f trainFlags, tr *trainer.Trainer, ckp *checkpointer, res *trainResult, logf func(string, ...any), p *progress) error {
	ctx, pre := watchPreemption(ctx)
	defer pre.stop()
	for tr.Iteration() < f.steps && !pre.pending() {
		p.update(tr.Iteration(), f.steps)
		if err := ctx.Err(); err != nil {
			// A signal that came before train claimed it (or the caller's
			// cancellation): stop without saving.
			return fmt.Errorf("training stopped after step %d of %d (%s): %w", tr.Iteration(), f.steps, lastSaved(ckp.checkpoints), context.Cause(ctx))
		}
		if err := ckp.poll(ctx); err != nil {
			return err
		}
		loss, err := ckp.step(ctx, tr)
		if err != nil {
			return fmt.Errorf("training stopped in step %d of %d (%s): %w", tr.Iteration()+1, f.steps, lastSaved(ckp.checkpoints), err)
		}
		step := tr.Iteration()
		res.Loss = loss
		if f.saveEvery > 0 && step%f.saveEvery == 0 {
			if err := ckp.save(ctx, tr); err != nil {
				if pre.pending() {
					return &preemptedError{sig: pre.signal(), step: step, aborted: err}
				}
				return err
			}
		} else {
			logf("step %d loss %.6f lr %g", step, loss, tr.LR())
		}
	}
	if pre.pending() {
		pe := &preemptedError{sig: pre.signal(), step: tr.Iteration()}
		logf("%s: stopping at step %d", signalName(pe.sig), pe.step)
		pe.saved, pe.aborted = ckp.preempt(ctx, tr, f.preemptGrace)
		return pe
	}
	return ckp.finish(ctx)
}

// lastSaved says which checkpoint an interrupted run can resume from.
func lastSaved(saved []string) string {
	if len(saved) == 0 {
		return "no checkpoint saved by this run"
	}
	return "last checkpoint saved: " + saved[len(saved)-1]
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bytesize"
	"github.com/ckptkit/ckptkit/internal/trainer"
	"github.com/ckptkit/ckptkit/loader"
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
	async        bool
	stateSize    string
	stagingBytes string
	preemptGrace time.Duration
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
	StagingPeakBytes    int64    `json:"staging_peak_bytes"`
	StateBytes          int64    `json:"state_bytes"`
	Preempted           string   `json:"preempted,omitempty"`
	// Note says why nothing was trained (a --resume at or past --steps).
	Note string `json:"note,omitempty"`
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train [RUN_URL] --steps N --save-every K [--ranks R] [--resume [--allow-fresh] | --force] [--async] [--state-size SIZE]",
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
--async saves in the background: the loop blocks only while the state is
copied into a staging pool of at most --staging-bytes (a larger state is
staged in pieces as the writes drain them), and a save waits for the
previous one to commit.

SIGTERM or SIGINT: the step under way finishes, the in-flight save may
commit (for at most --preempt-grace), the current step is saved
synchronously, its URL is printed and ckpt exits 143 (SIGTERM) or 130
(SIGINT). A second signal aborts at once; nothing half-written is ever
committed.

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
	fl.BoolVar(&f.async, "async", false, "save in the background, within the --staging-bytes budget")
	fl.StringVar(&f.stateSize, "state-size", "0", "scale the checkpoint to about SIZE (e.g. 1GiB) with a ballast parameter; "+bytesize.Rule)
	fl.StringVar(&f.stagingBytes, "staging-bytes", "512MiB", "host memory an --async save may stage at once; "+bytesize.Rule)
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
	if f.resume && f.force {
		return usage(fmt.Errorf("--resume and --force exclude each other: --resume continues the run, --force replaces its checkpoints"))
	}
	run, err := openStore(ctx, f.url)
	if err != nil {
		return err
	}
	defer run.Close()
	if !f.resume && !f.force {
		if err := refuseFreshTrainInto(ctx, run); err != nil {
			return err
		}
	}
	logf := func(format string, a ...any) {
		if !f.json {
			inv(cmd).notef(format, a...)
		}
	}
	tr := trainer.NewSized(f.seed, stateSize)
	res := &trainResult{URL: run.String(), Ranks: f.ranks, Checkpoints: []string{}, OptimizerLoaded: true}

	if f.resume {
		// Latest opens the newest valid checkpoint and reads its metadata
		// once; the load below reads through that same opened checkpoint.
		found, skipped, err := catalog.Latest(ctx, run, false)
		for _, s := range skipped {
			logf("skipping %s: %s", safe(s.Entry.URL), safe(s.Reason))
		}
		switch {
		case errors.Is(err, catalog.ErrNoCommittedCheckpoint):
			for _, s := range skipped {
				if s.Entry.Unreadable != "" {
					// It may be committed: starting over could throw the
					// run away.
					return ckpterr.WithClass(fmt.Errorf("resume: no readable committed checkpoint under %s (%s: %s); make it readable or remove it, or train without --resume", run, s.Entry.URL, s.Entry.Unreadable), ckpterr.Access)
				}
				if s.Entry.Committed {
					// Committed checkpoints exist but none is valid: starting
					// over would silently throw the run away.
					return bad(fmt.Errorf("resume: every committed checkpoint under %s failed verification (newest: %s: %s); fix or remove them, or train without --resume", run, s.Entry.URL, s.Reason))
				}
			}
			if !f.allowFresh {
				if perr := requirePath(ctx, run); perr != nil {
					return fmt.Errorf("resume: %w; pass --allow-fresh to start a new run there", perr)
				}
			}
			logf("fresh start: no committed checkpoint under %s; starting from step 0", run)
		case err != nil:
			return err
		default:
			withOptim := !f.noLoadOptim
			var targets []*statedict.StateDict
			c, rep, err := catalog.LoadWithFallback(ctx, run, found, func(c *loader.Checkpoint) (*loader.Report, error) {
				targets = tr.LoadTargets(f.ranks, withOptim)
				return c.Load(ctx, targets, loader.Options{NoLoadOptimizer: f.noLoadOptim})
			}, logf)
			if err != nil {
				return bad(fmt.Errorf("resume: %w", err))
			}
			if err := tr.Restore(targets, rep.Iteration, rep.LazyParams, rep.OptimizerLoaded); err != nil {
				return bad(fmt.Errorf("resume from %s: %w", c.URL(), err))
			}
			step := rep.Iteration
			res.ResumedFrom, res.ResumedURL = &step, c.URL()
			res.PrunedOptimizerKeys = rep.LazyKeys
			res.OptimizerLoaded = rep.OptimizerLoaded
			logf("resumed from %s at step %d (%d lazily-absent optimizer keys left fresh)", c.URL(), step, rep.LazyKeys)
			if step >= f.steps {
				return resumedPastTarget(cmd, f, res, tr)
			}
		}
	}

	ckp, err := newCheckpointer(run, f, stagingBytes, func(step int64) saver.Options {
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
	res.StagingPeakBytes = ckp.stagingPeak()
	// A preempted run still reports (its error, printed by run, says where
	// the current step was saved).
	var pe *preemptedError
	if errors.As(loopErr, &pe) {
		res.Preempted = signalName(pe.sig)
	} else if loopErr != nil {
		return loopErr
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
		loss := tr.Step()
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

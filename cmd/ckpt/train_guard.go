package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/trainer"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// trainURL resolves the run URL of `ckpt train`: the positional argument,
// or --url (its alias, kept for old scripts); both only when they agree.
func trainURL(cmd *cobra.Command, args []string, flagURL string) (string, error) {
	if len(args) == 0 {
		return flagURL, nil
	}
	if cmd.Flags().Changed("url") && flagURL != args[0] {
		return "", usage(fmt.Errorf("train: the run URL is given twice (%q and --url %q); give it once, as the argument", args[0], flagURL))
	}
	return args[0], nil
}

// refuseFreshTrainInto refuses a training from step 0 (no --resume, no
// --force) into a run that already holds checkpoints: it would replace the
// ones at the steps it saves and leave the others, so that "ckpt latest"
// would return another run's newer step.
func refuseFreshTrainInto(ctx context.Context, run *backend.Store) error {
	es, err := catalog.List(ctx, run)
	if err != nil {
		return err
	}
	if len(es) == 0 {
		return nil
	}
	names := make([]string, 0, 4)
	for i, e := range es {
		if i == 3 && len(es) > 4 {
			names = append(names, fmt.Sprintf("... %d more", len(es)-3))
			break
		}
		names = append(names, e.Name)
	}
	return refuseReplace(run.String(), fmt.Sprintf("the run already holds %d checkpoint(s) (%s); training from step 0 would replace some and leave newer ones from the earlier run: pass --resume to continue it, or use another run URL", len(es), strings.Join(names, ", ")))
}

// resumedPastTarget is the outcome of a --resume that finds the run at or
// past --steps: nothing to train, no loss to report.
// The weights and LR reported are the restored ones; no loss is.
func resumedPastTarget(cmd *cobra.Command, f trainFlags, res *trainResult, tr *trainer.Trainer) error {
	at := tr.Iteration()
	res.Step, res.LR, res.WeightsSHA256 = at, tr.LR(), tr.WeightsSHA256()
	res.Note = fmt.Sprintf("the run is already at step %d, at or past --steps %d: nothing to train", at, f.steps)
	if f.json {
		emit(cmd, res)
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s (resumed from %s)\n", res.Note, safe(res.ResumedURL))
	return nil
}

// resumeRun resumes the run at store for `ckpt train --resume` (run.Resume:
// the newest valid checkpoint, falling back past damaged data, refusing when
// committed checkpoints exist but none is valid), saying what it skipped
// through logf. Nothing stored is a "no such path" unless --allow-fresh.
// With --local (tiered non-nil) it takes the nearest valid tier
// (run.Tiered.ResumeTiered) and says which.
func resumeRun(ctx context.Context, store *backend.Store, tiered *ckrun.Tiered, f trainFlags, logf func(string, ...any), load ckrun.LoadFunc) (*ckrun.TierResumed, error) {
	opts := ckrun.ResumeOptions{Load: load, AllowFresh: f.allowFresh, Logf: func(format string, a ...any) {
		logf("%s", safe(fmt.Sprintf(format, a...)))
	}}
	var res *ckrun.TierResumed
	var err error
	if tiered != nil {
		res, err = tiered.ResumeTiered(ctx, opts)
	} else {
		var r *ckrun.Resumed
		if r, err = ckrun.New(store).Resume(ctx, opts); err == nil {
			res = &ckrun.TierResumed{Resumed: r}
		}
	}
	switch {
	case errors.Is(err, ckrun.ErrNothingStored):
		return nil, fmt.Errorf("resume: %w; pass --allow-fresh to start a new run there", &pathError{url: store.String()})
	case err != nil:
		return nil, bad(fmt.Errorf("resume: %w", err))
	}
	return res, nil
}

package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// latestOutput is the --json document of ckpt latest.
type latestOutput struct {
	header
	// URL is the run's URL; Checkpoint the one found (absent when none).
	URL        string          `json:"url"`
	Deep       bool            `json:"deep"`
	Checkpoint *latestFound    `json:"checkpoint,omitempty"`
	Skipped    []latestSkipped `json:"skipped"`
	// Local is the local tier's newest valid checkpoint (--local), Nearest
	// the tier a resume would try first: "local" when the local one is at
	// least as new as the run's, else "durable" ("" when neither has one).
	Local   *latestTier `json:"local,omitempty"`
	Nearest string      `json:"nearest,omitempty"`
}

// latestTier is a local tier's newest valid checkpoint in latest --json.
type latestTier struct {
	URL        string          `json:"url"`
	Checkpoint *latestFound    `json:"checkpoint,omitempty"`
	Skipped    []latestSkipped `json:"skipped"`
}

type latestFound struct {
	Name   string `json:"name"`
	Step   int64  `json:"step"`
	URL    string `json:"url"`
	Format string `json:"format"`
}

type latestSkipped struct {
	Name   string `json:"name"`
	Step   int64  `json:"step"`
	URL    string `json:"url"`
	Reason string `json:"reason"`
}

func newLatestCmd() *cobra.Command {
	var asJSON, deep bool
	var localURL string
	cmd := &cobra.Command{
		Use:   "latest RUN_URL",
		Short: "Print the newest committed checkpoint under a run that passes verify",
		Long: `Walks the run's step-NNNNNNNN checkpoints newest first and prints the first
that is committed and passes verify (with --deep, reading every byte and
checking every checksum, with progress on a terminal): its URL and step. Newer checkpoints passed over
are listed with the reason (on stderr, or in the JSON).
Exit 0 when one is found; 1 when committed checkpoints exist but none
passes verify; 3 when nothing is stored under RUN_URL ("no such path") or
no checkpoint under it is committed. --local LOCAL also finds the newest
valid checkpoint of the run's local tier (ckpt train --local) and says which
tier a resume tries first ("nearest": the local one when it is at least as
new); a valid local checkpoint then exits 0 whatever the run holds.`,
		Example: `  ckpt latest ./runs/demo
  ckpt latest --deep s3://bucket/runs/demo --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			run, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer run.Close()
			opts := ckrun.LatestOptions{Deep: deep}
			var p *progress
			if deep {
				p = newProgress(cmd, "latest")
				if p != nil {
					// One bar per candidate: a skipped one starts it over.
					opts.Progress = p.callback()
				}
			}
			found, skipped, err := ckrun.New(run).Latest(ctx, opts)
			out := &latestOutput{URL: run.String(), Deep: deep, Skipped: skippedJSON(skipped)}
			var refused *ckrun.RefusedError
			if err != nil && !errors.As(err, &refused) {
				p.finish()
				return err
			}
			if localURL != "" {
				lt, lerr := latestLocal(cmd, localURL, opts)
				if lerr != nil {
					p.finish()
					return lerr
				}
				out.Local = lt
			}
			p.finish()
			if found == nil && len(skipped) == 0 && out.Local == nil {
				if perr := requirePath(ctx, run); perr != nil {
					return perr
				}
			}
			if found != nil {
				out.Checkpoint = foundJSON(found)
			}
			out.Nearest = nearest(out)
			if asJSON {
				emit(cmd, out)
			} else {
				for _, s := range out.Skipped {
					inv(cmd).notef("skipped %s: %s", safe(s.Name), safe(s.Reason))
				}
				if c := out.Checkpoint; c != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\tstep %d\n", safe(c.URL), c.Step)
				}
				if out.Local != nil {
					for _, s := range out.Local.Skipped {
						inv(cmd).notef("local: skipped %s: %s", safe(s.Name), safe(s.Reason))
					}
					if c := out.Local.Checkpoint; c != nil {
						fmt.Fprintf(cmd.OutOrStdout(), "%s\tstep %d\tlocal\n", safe(c.URL), c.Step)
					}
					if out.Nearest != "" {
						fmt.Fprintf(cmd.OutOrStdout(), "nearest: %s\n", out.Nearest)
					}
				}
			}
			switch {
			case out.Nearest == ckrun.TierLocal:
				return nil // the local tier holds one: a resume has a copy
			case err != nil:
				return err // committed checkpoints exist, and none is valid
			case found == nil:
				return fmt.Errorf("%s: %w", run, catalog.ErrNoCommittedCheckpoint)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&deep, "deep", false, "verify every byte of the candidate (checksums)")
	cmd.Flags().StringVar(&localURL, "local", "", "also find the newest valid checkpoint of the run's local tier (ckpt train --local; docs/TIERS.md)")
	return cmd
}

func skippedJSON(ss []ckrun.Skipped) []latestSkipped {
	out := []latestSkipped{}
	for _, s := range ss {
		out = append(out, latestSkipped{Name: s.Entry.Name, Step: s.Entry.Step, URL: s.Entry.URL, Reason: s.Reason})
	}
	return out
}

func foundJSON(f *ckrun.Found) *latestFound {
	e := f.Entry
	return &latestFound{Name: e.Name, Step: e.Step, URL: e.URL, Format: e.Format}
}

// latestLocal is the local tier's newest valid checkpoint; a local tier
// that is gone, or whose checkpoints all fail, has none.
func latestLocal(cmd *cobra.Command, url string, opts ckrun.LatestOptions) (*latestTier, error) {
	ctx := cmd.Context()
	local, err := openStore(ctx, url)
	if err != nil {
		return nil, err
	}
	defer local.Close()
	found, skipped, err := ckrun.New(local).Latest(ctx, opts)
	var refused *ckrun.RefusedError
	if err != nil && !errors.As(err, &refused) && ckpterr.ClassOf(err) != ckpterr.NotFound {
		return nil, err
	}
	lt := &latestTier{URL: local.String(), Skipped: skippedJSON(skipped)}
	if found != nil {
		lt.Checkpoint = foundJSON(found)
	}
	return lt, nil
}

// nearest is the tier a resume would try first (without loading: the
// local copy may still turn out damaged, ckpt train --resume then falls
// back).
func nearest(out *latestOutput) string {
	switch {
	case out.Local != nil && out.Local.Checkpoint != nil && (out.Checkpoint == nil || out.Local.Checkpoint.Step >= out.Checkpoint.Step):
		return ckrun.TierLocal
	case out.Checkpoint != nil:
		return ckrun.TierDurable
	}
	return ""
}

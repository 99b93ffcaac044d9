package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/catalog"
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
	cmd := &cobra.Command{
		Use:   "latest RUN_URL",
		Short: "Print the newest committed checkpoint under a run that passes verify",
		Long: `Walks the run's step-NNNNNNNN checkpoints newest first and prints the first
that is committed and passes verify (with --deep, reading every byte and
checking every checksum, with progress on a terminal): its URL and step. Newer checkpoints passed over
are listed with the reason (on stderr, or in the JSON).
Exit 0 when one is found; 1 when committed checkpoints exist but none
passes verify; 3 when nothing is stored under RUN_URL ("no such path") or
no checkpoint under it is committed.`,
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
			p.finish()
			out := &latestOutput{URL: run.String(), Deep: deep, Skipped: []latestSkipped{}}
			for _, s := range skipped {
				out.Skipped = append(out.Skipped, latestSkipped{Name: s.Entry.Name, Step: s.Entry.Step, URL: s.Entry.URL, Reason: s.Reason})
			}
			var refused *ckrun.RefusedError
			if err != nil && !errors.As(err, &refused) {
				return err
			}
			if found == nil && len(skipped) == 0 {
				if perr := requirePath(ctx, run); perr != nil {
					return perr
				}
			}
			if found != nil {
				e := found.Entry
				out.Checkpoint = &latestFound{Name: e.Name, Step: e.Step, URL: e.URL, Format: e.Format}
			}
			if asJSON {
				emit(cmd, out)
			} else {
				for _, s := range out.Skipped {
					inv(cmd).notef("skipped %s: %s", safe(s.Name), safe(s.Reason))
				}
				if c := out.Checkpoint; c != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\tstep %d\n", safe(c.URL), c.Step)
				}
			}
			if err != nil {
				return err // committed checkpoints exist, and none is valid
			}
			if found == nil {
				return fmt.Errorf("%s: %w", run, catalog.ErrNoCommittedCheckpoint)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&deep, "deep", false, "verify every byte of the candidate (checksums)")
	return cmd
}

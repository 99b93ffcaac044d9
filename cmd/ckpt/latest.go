package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
)

type latestSkipped struct {
	Name   string `json:"name"`
	Step   int64  `json:"step"`
	Reason string `json:"reason"`
}

type latestOutput struct {
	URL     string          `json:"url"`
	Name    string          `json:"name"`
	Step    int64           `json:"step"`
	Format  string          `json:"format"`
	Deep    bool            `json:"deep"`
	Skipped []latestSkipped `json:"skipped"`
}

func newLatestCmd() *cobra.Command {
	var asJSON, deep bool
	cmd := &cobra.Command{
		Use:   "latest RUN_URL",
		Short: "Print the newest committed checkpoint under a run that passes verify",
		Long: `Walks the run's step-NNNNNNNN checkpoints newest first and prints the first
that is committed and passes verify (with --deep, reading every byte and
checking every checksum): its URL and step. Newer checkpoints passed over
are listed with the reason (on stderr, or in the JSON).
Exit 0 when one is found, 1 when none is, 2 on usage or access errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			run, err := backend.Open(ctx, args[0])
			if err != nil {
				return err
			}
			defer run.Close()
			e, skipped, err := catalog.Latest(ctx, run, deep)
			out := latestOutput{Deep: deep, Skipped: []latestSkipped{}}
			for _, s := range skipped {
				out.Skipped = append(out.Skipped, latestSkipped{Name: s.Entry.Name, Step: s.Entry.Step, Reason: s.Reason})
			}
			if err != nil && !errors.Is(err, catalog.ErrNoCommittedCheckpoint) {
				return err
			}
			if e != nil {
				out.URL, out.Name, out.Step, out.Format = e.URL, e.Name, e.Step, e.Format
			}
			if asJSON {
				if werr := writeJSON(cmd.OutOrStdout(), out); werr != nil {
					return werr
				}
			} else {
				for _, s := range out.Skipped {
					fmt.Fprintf(cmd.ErrOrStderr(), "skipped %s: %s\n", s.Name, s.Reason)
				}
				if e != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\tstep %d\n", out.URL, out.Step)
				}
			}
			if err != nil {
				return bad(err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&deep, "deep", false, "verify every byte of the candidate (checksums)")
	return cmd
}

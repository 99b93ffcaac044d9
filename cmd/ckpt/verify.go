package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
)

func newVerifyCmd() *cobra.Command {
	var asJSON, deep bool
	cmd := &cobra.Command{
		Use:   "verify URL",
		Short: "Pre-flight check that a checkpoint is resumable (exit 0), or say why not (exit 1)",
		Long: `Reads the checkpoint's metadata once and reports every problem by rule:
uncommitted, missing-object, object-size, partial-optimizer-state,
shard-coverage, layout-mismatch, and with --deep (which reads every byte)
checksum. Lazily-absent optimizer state is reported as information.
Exit 0 when resumable, 1 when not, 2 on usage or access errors.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, err := backend.Open(ctx, args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			update, finish := progressBar("verify", asJSON || !deep)
			rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: deep, Progress: update})
			finish()
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				printVerify(cmd.OutOrStdout(), rep)
			}
			if !rep.Resumable {
				return bad(fmt.Errorf("%s is not resumable: %d problem(s)", rep.URL, len(rep.Problems)))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&deep, "deep", false, "read every byte and check every checksum")
	return cmd
}

func printVerify(w io.Writer, r *loader.VerifyReport) {
	fmt.Fprintf(w, "checkpoint %s\n", r.URL)
	if r.Format != "" {
		fmt.Fprintf(w, "format %s %s (%s), iteration %d\n", r.Format, r.Version, r.Writer, r.Iteration)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "PROBLEM [%s] %s\n", p.Rule, p.Message)
	}
	for _, i := range r.Info {
		fmt.Fprintf(w, "info    [%s] %s\n", i.Rule, i.Message)
	}
	if r.Deep {
		fmt.Fprintf(w, "deep: %d bytes checked\n", r.BytesChecked)
	}
	if r.Resumable {
		fmt.Fprintln(w, "OK: resumable")
	} else {
		fmt.Fprintln(w, "NOT RESUMABLE")
	}
}

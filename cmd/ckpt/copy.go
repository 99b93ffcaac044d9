package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/transfer"
)

func newCopyCmd() *cobra.Command {
	var asJSON, force bool
	var parallel int
	cmd := &cobra.Command{
		Use:   "copy SRC DST",
		Short: "Copy a committed checkpoint between any two URLs, data first and CRC-checked, metadata last",
		Long: `Copies the committed checkpoint at SRC to DST (any two backends: fs -> s3,
s3 -> gs, ...). Data objects are streamed in parallel and every chunk's CRC32C
is checked on the way; the metadata object is written last, so an interrupted
copy never leaves a committed-looking checkpoint. A committed DST is refused
unless --force. A progress bar is shown on a terminal (not with --json).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			src, err := backend.Open(ctx, args[0])
			if err != nil {
				return err
			}
			defer src.Close()
			dst, err := backend.Open(ctx, args[1])
			if err != nil {
				return err
			}
			defer dst.Close()
			opts := transfer.Options{Parallel: parallel, Force: force}
			update, finish := progressBar("copy", asJSON)
			opts.Progress = update
			res, err := transfer.Copy(ctx, src, dst, opts)
			finish()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			cmd.Printf("copied %s -> %s (%s, %d objects, %d bytes, %s)\n", res.Source, res.Destination, res.Format, res.Objects, res.Bytes, res.Duration.Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&force, "force", false, "replace a committed checkpoint at DST")
	cmd.Flags().IntVar(&parallel, "parallel", 8, "objects copied at once")
	return cmd
}

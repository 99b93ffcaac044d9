package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/transfer"
)

// copyOutput is the --json document of ckpt copy.
type copyOutput struct {
	header
	Source      string  `json:"source"`
	Destination string  `json:"destination"`
	Format      string  `json:"format"`
	Objects     int     `json:"objects"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	// Unchecked: the source recorded no checksums (DCP written by torch
	// itself): only sizes were checked.
	Unchecked bool `json:"unchecked"`
}

func newCopyCmd() *cobra.Command {
	var asJSON, force, requireChecksums bool
	var parallel int
	cmd := &cobra.Command{
		Use:   "copy SRC DST",
		Short: "Copy a committed checkpoint between any two URLs, data first and CRC-checked, metadata last",
		Long: `Copies the committed checkpoint at SRC to DST (any two backends: fs -> s3,
s3 -> gs, ...). Data objects are streamed --parallel at a time and every
chunk's CRC32C is checked on the way; the metadata object is written last,
so an interrupted copy never leaves a committed-looking checkpoint.
Every item with a recorded CRC32C is checked: all of a native checkpoint's,
and all of a DCP checkpoint's written by ckptkit.torch.save (through its
integrity object). A corrupt item stops the copy (exit 1) and nothing is
committed at DST. A DCP checkpoint written by torch itself recorded no
checksums: it is copied with a warning that no data byte could be checked,
or refused (exit 1) with --require-checksums.
A committed checkpoint at DST is refused (exit 6, conflict) unless --force.
Progress (bytes done / total, rate, ETA) is shown on a terminal.`,
		Example: `  ckpt copy ./runs/demo/step-00000012 s3://bucket/runs/demo/step-00000012
  ckpt copy --parallel 16 gs://a/run/step-00000100 s3://b/run/step-00000100
  ckpt copy --force ./runs/demo/step-00000012 ./backup/step-00000012`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			src, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer src.Close()
			dst, err := openStore(ctx, args[1])
			if err != nil {
				return err
			}
			defer dst.Close()
			opts := transfer.Options{Parallel: parallel, Force: force, RequireChecksums: requireChecksums}
			p := newProgress(cmd, "copy")
			opts.Progress = p.callback()
			res, err := transfer.Copy(ctx, src, dst, opts)
			p.finish()
			if errors.Is(err, loader.ErrNoCheckpoint) || errors.Is(err, loader.ErrIncomplete) {
				return orNoSuchPath(ctx, src, err)
			}
			if err != nil {
				return err
			}
			if res.Unchecked {
				inv(cmd).notef("warning: copied %s unchecked: %s (--require-checksums refuses such a copy)", safe(res.Source), transfer.UncheckedNote)
			}
			if asJSON {
				emit(cmd, &copyOutput{Source: res.Source, Destination: res.Destination, Format: res.Format, Objects: res.Objects, Bytes: res.Bytes,
					Seconds: res.Duration.Seconds(), Unchecked: res.Unchecked})
				return nil
			}
			cmd.Printf("copied %s -> %s (%s, %d objects, %s, %s)\n", safe(res.Source), safe(res.Destination), safe(res.Format), res.Objects, humanBytes(res.Bytes), res.Duration.Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&force, forceFlag, false, "replace a committed checkpoint at DST")
	cmd.Flags().BoolVar(&requireChecksums, "require-checksums", false, "refuse a source that recorded no checksums (a DCP checkpoint written by torch itself)")
	addParallelFlag(cmd, &parallel, "objects copied at once")
	return cmd
}

package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/loader"
	ckrun "github.com/ckptkit/ckptkit/run"
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
	// Checkpoints and Skipped: a run's copy (format "run"), each
	// checkpoint copied and each one passed over with the reason.
	Checkpoints []copiedCheckpoint `json:"checkpoints,omitzero"`
	Skipped     []copySkipped      `json:"skipped,omitzero"`
}

type copiedCheckpoint struct {
	Name      string `json:"name"`
	Format    string `json:"format"`
	Objects   int    `json:"objects"`
	Bytes     int64  `json:"bytes"`
	Unchecked bool   `json:"unchecked"`
}

type copySkipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// copyRun copies every committed checkpoint of the run src that verifies
// to dst/<name>, skipping (and naming) the others.
func copyRun(cmd *cobra.Command, src, dst *backend.Store, entries []catalog.Entry, opts transfer.Options, asJSON bool) error {
	ctx := cmd.Context()
	start := time.Now()
	out := &copyOutput{Source: src.String(), Destination: dst.String(), Format: "run", Checkpoints: []copiedCheckpoint{}, Skipped: []copySkipped{}}
	skip := func(name, reason string) {
		out.Skipped = append(out.Skipped, copySkipped{Name: name, Reason: reason})
		inv(cmd).notef("skipping %s: %s", safe(name), safe(reason))
	}
	present := 0 // already committed at the destination
	for _, e := range entries {
		if e.Unreadable != "" {
			skip(e.Name, "unreadable: "+e.Unreadable)
			continue
		}
		if !e.Committed {
			skip(e.Name, "uncommitted")
			continue
		}
		from, err := src.Sub(e.Name)
		if err != nil {
			return err
		}
		to, err := dst.Sub(e.Name)
		if err != nil {
			return err
		}
		// One metadata read per checkpoint: opened, verified, copied.
		c, err := loader.Open(ctx, from)
		if err != nil {
			if ckpterr.ClassOf(err) == ckpterr.BadCheckpoint {
				skip(e.Name, fmt.Sprintf("does not open: %v", err))
				continue
			}
			return err
		}
		rep, err := c.Verify(ctx, loader.VerifyOptions{})
		if err != nil {
			return err
		}
		if !rep.Resumable {
			skip(e.Name, fmt.Sprintf("fails verification (%s: %s)", rep.Problems[0].Rule, rep.Problems[0].Message))
			continue
		}
		p := newProgress(cmd, "copy "+e.Name)
		opts.Progress = p.callback()
		res, err := transfer.CopyCheckpoint(ctx, c, to, opts)
		p.finish()
		switch {
		case errors.Is(err, transfer.ErrDestinationCommitted):
			skip(e.Name, "already committed at the destination (--force replaces it)")
			present++
			continue
		case err != nil && ckpterr.ClassOf(err) == ckpterr.BadCheckpoint:
			skip(e.Name, err.Error())
			continue
		case err != nil:
			return err
		}
		if res.Unchecked {
			inv(cmd).notef("warning: copied %s unchecked: %s", safe(res.Source), transfer.UncheckedNote)
		}
		out.Checkpoints = append(out.Checkpoints, copiedCheckpoint{Name: e.Name, Format: res.Format, Objects: res.Objects, Bytes: res.Bytes, Unchecked: res.Unchecked})
		out.Objects += res.Objects
		out.Bytes += res.Bytes
		out.Unchecked = out.Unchecked || res.Unchecked
	}
	out.Seconds = time.Since(start).Seconds()
	var err error
	if len(out.Checkpoints) == 0 && present == 0 {
		err = ckpterr.WithClass(fmt.Errorf("copy %s: no checkpoint of the run could be copied (%d skipped)", src, len(out.Skipped)), ckpterr.BadCheckpoint)
	}
	if asJSON {
		emit(cmd, out) // written with the error, if any
		return err
	}
	if err != nil {
		return err
	}
	cmd.Printf("copied %d checkpoint(s) of %s -> %s (%d objects, %s, %s); %d skipped\n", len(out.Checkpoints), safe(out.Source), safe(out.Destination),
		out.Objects, humanBytes(out.Bytes), time.Since(start).Round(time.Millisecond), len(out.Skipped))
	return nil
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
SRC may be a run (a prefix holding step-NNNNNNNN checkpoints): each
committed checkpoint that verifies is copied to DST/<its name>, oldest
first; the others (uncommitted, unreadable, not opening, failing verification, corrupt bytes found
while copying, or already committed at DST without --force) are skipped
and named. It fails (exit 1) only when no checkpoint was copied and none
was already at DST.
Progress (bytes done / total, rate, ETA) is shown on a terminal.`,
		Example: `  ckpt copy ./runs/demo/step-00000012 s3://bucket/runs/demo/step-00000012
  ckpt copy ./runs/demo s3://bucket/runs/demo
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
			if err != nil {
				// A run (run.Steps, the rule of run.Choose): every
				// committed, valid checkpoint under it.
				entries, lerr := ckrun.Steps(ctx, src, err)
				if lerr == nil && len(entries) > 0 {
					return copyRun(cmd, src, dst, entries, opts, asJSON)
				}
				if lerr != err { // not a checkpoint, and not a run
					return orNoSuchPath(ctx, src, err)
				}
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

package main

import (
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/convert/native"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/internal/bytesize"
)

// convertOutput is the --json document of ckpt convert.
type convertOutput struct {
	header
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Format is the output format: safetensors or ckptkit.
	Format string `json:"format"`
	// Tensors and Values count the tensors and byte values written; Bytes
	// the data bytes written.
	Tensors   int     `json:"tensors"`
	Values    int     `json:"values"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	Iteration *int64  `json:"iteration,omitempty"`
	// Files are the safetensors files written, Index the index file ("" when
	// unsharded), Skipped the keys safetensors does not hold.
	Files   []convertFile `json:"files,omitempty"`
	Index   string        `json:"index,omitempty"`
	Skipped []string      `json:"skipped,omitempty"`
}

// convertFile is a safetensors file written (a safetensors.OutFile).
type convertFile struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Tensors int    `json:"tensors"`
}

func newConvertCmd() *cobra.Command {
	var (
		to, shardSize, maxMemory string
		modelOnly, asJSON, force bool
	)
	cmd := &cobra.Command{
		Use:   "convert SRC DST --to safetensors|ckptkit",
		Short: "Convert a checkpoint to Hugging Face safetensors or to ckptkit's native format",
		Long: `Reads the checkpoint at SRC (any format the loader reads; a run URL stands for
its newest valid checkpoint) and writes it under DST.

--to safetensors writes model.safetensors, or model-NNNNN-of-NNNNN.safetensors
shards of at most --shard-size tensor bytes plus model.safetensors.index.json
(written last). Tensors are streamed from their shards, one at a time, into
each file as a single upload of known size, so memory follows neither the
checkpoint nor a tensor's size. Bytes values (scheduler, RNG state) have no
place in safetensors and are skipped (listed in --json output).
--model-only keeps the model's keys and strips their "model." prefix.

--to ckptkit saves the checkpoint natively from one rank (the saver takes an
in-memory state, so the whole checkpoint is held in memory).

--max-memory caps memory (also set as the Go soft memory limit): safetensors
conversion streams tensors saved as whole-row raw chunks (what ckptkit
saves) whatever the cap, reads any other tensor (DCP items, column shards)
in row slabs costing at most a quarter of the cap (the slab plus the stored
chunks it touches) and refuses, before writing anything, such a tensor
whose smallest slab costs more; native conversion refuses
a checkpoint larger than the cap. Sizes are ` + bytesize.Rule + `
(so the default --shard-size 5GB is 5*10^9 bytes, as in Hugging Face).

Output already at DST (safetensors files, or a committed checkpoint) is
refused (exit 6, conflict) unless --force. Progress (tensor bytes written
/ total, rate, ETA) is shown on a terminal for safetensors.`,
		Example: `  ckpt convert ./runs/demo/step-00000012 ./hf --to safetensors --model-only
  ckpt convert --shard-size 2GB --max-memory 1GiB s3://bucket/run/step-00000100 ./hf --to safetensors
  ckpt convert ./dcp-checkpoint ./native --to ckptkit --force`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			shard, err := bytesize.Parse(shardSize)
			if err != nil {
				return usage(fmt.Errorf("--shard-size: %w", err))
			}
			capBytes, err := bytesize.Parse(maxMemory)
			if err != nil {
				return usage(fmt.Errorf("--max-memory: %w", err))
			}
			if to != "safetensors" && to != "ckptkit" {
				return usage(fmt.Errorf("--to must be safetensors or ckptkit, got %q", to))
			}
			if capBytes > 0 {
				defer debug.SetMemoryLimit(debug.SetMemoryLimit(capBytes))
			}
			src, _, err := openCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			defer src.Store().Close()
			dst, err := openStore(ctx, args[1])
			if err != nil {
				return err
			}
			defer dst.Close()
			out := &convertOutput{Source: src.URL(), Destination: dst.String(), Format: to}
			start := time.Now()
			if to == "safetensors" {
				if names, err := safetensorsAt(ctx, dst); err != nil {
					return err
				} else if len(names) > 0 && !force {
					return refuseReplace(dst.String(), "it holds safetensors output ("+strings.Join(names, ", ")+")")
				}
				opts := safetensors.Options{ShardSize: shard, ModelOnly: modelOnly, MaxMemory: capBytes}
				if p := newProgress(cmd, "convert"); p != nil {
					opts.Progress = p.callback()
					defer p.finish()
				}
				res, err := safetensors.Convert(ctx, src, dst, opts)
				if err != nil {
					return err
				}
				out.Tensors, out.Bytes, out.Index, out.Skipped = res.Tensors, res.TotalSize, res.Index, res.Skipped
				for _, f := range res.Files {
					out.Files = append(out.Files, convertFile{Name: f.Name, Size: f.Size, Tensors: f.Tensors})
				}
				if !asJSON {
					for _, f := range res.Files {
						fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d tensors, %s)\n", safe(dst.URL(f.Name)), f.Tensors, humanBytes(f.Size))
					}
					if res.Index != "" {
						fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", safe(dst.URL(res.Index)))
					}
					if len(res.Skipped) > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "skipped %d key(s) safetensors does not hold or --model-only excludes\n", len(res.Skipped))
					}
				}
			} else {
				if exists, err := committedAt(ctx, dst); err != nil {
					return err
				} else if exists && !force {
					return refuseReplace(dst.String(), "it holds a committed checkpoint")
				}
				res, err := native.Convert(ctx, src, dst, native.Options{ModelOnly: modelOnly, MaxMemory: capBytes, Overwrite: force})
				if err != nil {
					return err
				}
				it := res.Metadata.Training.Iteration
				out.Tensors, out.Values, out.Bytes, out.Iteration = len(res.Metadata.Tensors), len(res.Metadata.Bytes), res.BytesWritten, &it
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "saved %s (%d tensors, %d bytes values, %s, iteration %d)\n", safe(res.URL), out.Tensors, out.Values, humanBytes(res.BytesWritten), it)
				}
			}
			out.Seconds = time.Since(start).Seconds()
			if asJSON {
				emit(cmd, out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "output format: safetensors or ckptkit (required)")
	f.StringVar(&shardSize, "shard-size", "5GB", "safetensors: maximum tensor bytes per file (0: one file); "+bytesize.Rule)
	f.StringVar(&maxMemory, "max-memory", "0", "memory cap (0: none), e.g. 512MiB; "+bytesize.Rule)
	f.BoolVar(&modelOnly, "model-only", false, `keep only model keys (safetensors: strip the "model." prefix)`)
	f.BoolVar(&asJSON, "json", false, jsonHelp)
	f.BoolVar(&force, forceFlag, false, "replace safetensors output or a committed checkpoint at DST")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

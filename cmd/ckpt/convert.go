package main

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/convert/native"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/internal/bytesize"
)

type convertOutput struct {
	From        string              `json:"from"`
	To          string              `json:"to"`
	Format      string              `json:"format"`
	Safetensors *safetensors.Result `json:"safetensors,omitempty"`
	Native      *nativeSummary      `json:"native,omitempty"`
}

type nativeSummary struct {
	Tensors      int   `json:"tensors"`
	Bytes        int   `json:"bytes_values"`
	BytesWritten int64 `json:"bytes_written"`
	Iteration    int64 `json:"iteration"`
}

func newConvertCmd() *cobra.Command {
	var (
		to, shardSize, maxMemory string
		modelOnly, asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "convert SRC DST --to safetensors|ckptkit",
		Short: "Convert a checkpoint to Hugging Face safetensors or to ckptkit's native format",
		Long: `Reads the checkpoint at SRC (any format the loader reads; a run URL stands for
its newest valid checkpoint) and writes it under DST.

--to safetensors writes model.safetensors, or model-NNNNN-of-NNNNN.safetensors
shards of at most --shard-size tensor bytes plus model.safetensors.index.json
(written last). Tensors are reassembled from their shards one at a time and
streamed into each file as a single upload of known size, so memory is
bounded by the largest tensor. Bytes values (scheduler, RNG state) have no
place in safetensors and are skipped (listed in --json output).
--model-only keeps the model's keys and strips their "model." prefix.

--to ckptkit saves the checkpoint natively from one rank (the saver takes an
in-memory state, so the whole checkpoint is held in memory).

--max-memory caps memory (also set as the Go soft memory limit): safetensors
conversion reads each tensor in row slabs costing at most a quarter of the
cap (the slab plus the stored chunks it touches) and refuses, before writing
anything, a tensor whose smallest slab costs more; native conversion refuses
a checkpoint larger than the cap. Sizes are ` + bytesize.Rule + `
(so the default --shard-size 5GB is 5*10^9 bytes, as in Hugging Face).`,
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
			dst, err := backend.Open(ctx, args[1])
			if err != nil {
				return err
			}
			defer dst.Close()
			out := convertOutput{From: src.URL(), To: dst.String(), Format: to}
			stderr := cmd.ErrOrStderr()
			if to == "safetensors" {
				opts := safetensors.Options{ShardSize: shard, ModelOnly: modelOnly, MaxMemory: capBytes}
				if !asJSON {
					last := time.Now()
					opts.Progress = func(p safetensors.Progress) {
						if p.Done == p.Total || time.Since(last) > 2*time.Second {
							last = time.Now()
							fmt.Fprintf(stderr, "%s: %d/%d tensors, %s of %s\n", p.File, p.Done, p.Total, humanBytes(p.Bytes), humanBytes(p.TotalBytes))
						}
					}
				}
				res, err := safetensors.Convert(ctx, src, dst, opts)
				if err != nil {
					return err
				}
				out.Safetensors = res
				if !asJSON {
					for _, f := range res.Files {
						fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d tensors, %s)\n", dst.URL(f.Name), f.Tensors, humanBytes(f.Size))
					}
					if res.Index != "" {
						fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", dst.URL(res.Index))
					}
					if len(res.Skipped) > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "skipped %d key(s) safetensors does not hold or --model-only excludes\n", len(res.Skipped))
					}
				}
			} else {
				res, err := native.Convert(ctx, src, dst, native.Options{ModelOnly: modelOnly, MaxMemory: capBytes})
				if err != nil {
					return err
				}
				out.Native = &nativeSummary{Tensors: len(res.Metadata.Tensors), Bytes: len(res.Metadata.Bytes), BytesWritten: res.BytesWritten, Iteration: res.Metadata.Training.Iteration}
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "saved %s (%d tensors, %d bytes values, %s, iteration %d)\n", res.URL, out.Native.Tensors, out.Native.Bytes, humanBytes(res.BytesWritten), out.Native.Iteration)
				}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "output format: safetensors or ckptkit (required)")
	f.StringVar(&shardSize, "shard-size", "5GB", "safetensors: maximum tensor bytes per file (0: one file); "+bytesize.Rule)
	f.StringVar(&maxMemory, "max-memory", "0", "memory cap (0: none), e.g. 512MiB; "+bytesize.Rule)
	f.BoolVar(&modelOnly, "model-only", false, `keep only model keys (safetensors: strip the "model." prefix)`)
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

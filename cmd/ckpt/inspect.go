package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// openCheckpoint opens the checkpoint at rawURL, or, when rawURL is a run
// prefix, its newest committed valid checkpoint. resolved is the run URL in
// the second case.
func openCheckpoint(ctx context.Context, rawURL string) (c *loader.Checkpoint, resolvedFrom string, err error) {
	st, err := backend.Open(ctx, rawURL)
	if err != nil {
		return nil, "", err
	}
	c, err = loader.Open(ctx, st)
	if err == nil {
		return c, "", nil
	}
	if !errors.Is(err, loader.ErrIncomplete) && !errors.Is(err, loader.ErrNoCheckpoint) {
		return nil, "", err
	}
	found, _, lerr := catalog.Latest(ctx, st, false)
	if lerr != nil {
		if errors.Is(lerr, catalog.ErrNoCommittedCheckpoint) {
			return nil, "", bad(err)
		}
		return nil, "", lerr
	}
	return found.Checkpoint, st.String(), nil
}

type inspectChunk struct {
	Offsets  []int64 `json:"offsets"`
	Sizes    []int64 `json:"sizes"`
	Object   string  `json:"object"`
	Offset   int64   `json:"offset"`
	Length   int64   `json:"length"`
	CRC32C   string  `json:"crc32c,omitempty"`
	Encoding string  `json:"encoding,omitempty"`
}

type inspectTensor struct {
	Key    string         `json:"key"`
	DType  string         `json:"dtype"`
	Shape  []int64        `json:"shape"`
	Bytes  int64          `json:"bytes"`
	SHA256 string         `json:"sha256,omitempty"`
	Chunks []inspectChunk `json:"chunks"`
}

type inspectOutput struct {
	URL           string                 `json:"url"`
	ResolvedFrom  string                 `json:"resolved_from,omitempty"`
	Format        string                 `json:"format"`
	Version       string                 `json:"version"`
	Writer        string                 `json:"writer"`
	CreatedAt     time.Time              `json:"created_at,omitzero"`
	WorldSize     int                    `json:"world_size"`
	MetadataKey   string                 `json:"metadata_key"`
	MetadataBytes int                    `json:"metadata_bytes"`
	Training      metadata.TrainingState `json:"training"`
	Tensors       []inspectTensor        `json:"tensors"`
	Bytes         []metadata.BytesEntry  `json:"bytes"`
	Objects       []metadata.ObjectEntry `json:"objects"`
	TotalBytes    int64                  `json:"total_bytes"`
}

func newInspectCmd() *cobra.Command {
	var asJSON, hash bool
	cmd := &cobra.Command{
		Use:   "inspect URL",
		Short: "List a checkpoint (or a run's newest committed checkpoint) key by key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, from, err := openCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			out, err := describe(ctx, c, from, hash)
			if err != nil {
				return bad(err)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			printInspect(cmd.OutOrStdout(), out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&hash, "hash", false, "add each tensor's SHA-256 over its row-major little-endian bytes (reads every byte)")
	return cmd
}

func describe(ctx context.Context, c *loader.Checkpoint, from string, hash bool) (*inspectOutput, error) {
	md := c.Metadata()
	out := &inspectOutput{URL: c.URL(), ResolvedFrom: from, Format: c.FormatName(), Version: md.Version, Writer: md.Writer,
		CreatedAt: md.CreatedAt, WorldSize: md.WorldSize, MetadataKey: c.MetadataKey(), MetadataBytes: c.MetadataSize(),
		Training: md.Training, Bytes: md.Bytes, Objects: md.Objects, Tensors: []inspectTensor{}}
	for _, o := range md.Objects {
		out.TotalBytes += o.Size
	}
	for _, te := range md.Tensors {
		it := inspectTensor{Key: te.Key, DType: te.DType, Shape: te.Shape, Chunks: []inspectChunk{}}
		n := metadata.ElementSize(te.DType)
		for _, d := range te.Shape {
			n *= d
		}
		it.Bytes = n
		for _, ch := range te.Chunks {
			ic := inspectChunk{Offsets: ch.Offsets, Sizes: ch.Sizes, Object: ch.Object, Offset: ch.Offset, Length: ch.Length, Encoding: ch.Encoding}
			if ch.Encoding == metadata.EncodingRaw {
				ic.CRC32C = fmt.Sprintf("%08x", ch.CRC32C)
			}
			it.Chunks = append(it.Chunks, ic)
		}
		if hash {
			// Streamed: memory does not follow tensor size.
			h := sha256.New()
			if err := c.WriteTensor(ctx, te.Key, h); err != nil {
				return nil, err
			}
			it.SHA256 = hex.EncodeToString(h.Sum(nil))
		}
		out.Tensors = append(out.Tensors, it)
	}
	return out, nil
}

func printInspect(w io.Writer, o *inspectOutput) {
	if o.ResolvedFrom != "" {
		fmt.Fprintf(w, "run %s: newest committed checkpoint is %s\n", o.ResolvedFrom, o.URL)
	}
	fmt.Fprintf(w, "checkpoint %s\n", o.URL)
	fmt.Fprintf(w, "format %s %s, written by %s", o.Format, o.Version, o.Writer)
	if !o.CreatedAt.IsZero() {
		fmt.Fprintf(w, " at %s", o.CreatedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, ", world size %d\n", o.WorldSize)
	tr := o.Training
	fmt.Fprintf(w, "training: iteration %d, optimizer %s (prefix %q, slots %v, %d state entries), scheduler prefix %q\n",
		tr.Iteration, tr.Optimizer, tr.OptimizerPrefix, tr.OptimizerSlots, tr.OptimizerStateEntries, tr.SchedulerPrefix)
	fmt.Fprintf(w, "%d tensors, %d byte values, %d objects, %d data bytes, metadata %s (%d bytes)\n\n", len(o.Tensors), len(o.Bytes), len(o.Objects), o.TotalBytes, o.MetadataKey, o.MetadataBytes)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tDTYPE\tSHAPE\tCHUNKS\tOBJECTS\tBYTES\tSHA256")
	for _, t := range o.Tensors {
		objs := map[string]bool{}
		for _, c := range t.Chunks {
			objs[c.Object] = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t%d\t%s\n", t.Key, t.DType, t.Shape, len(t.Chunks), len(objs), t.Bytes, t.SHA256)
	}
	for _, b := range o.Bytes {
		fmt.Fprintf(tw, "%s\tbytes\t-\t1\t1\t%d\t\n", b.Key, b.Length)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nOBJECTS")
	for _, ob := range o.Objects {
		fmt.Fprintf(w, "  %s  %d bytes\n", ob.Key, ob.Size)
	}
}

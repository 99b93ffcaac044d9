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

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// openCheckpoint opens the checkpoint at rawURL, or, when rawURL is a run
// prefix, its newest committed valid checkpoint. resolved is the run URL in
// the second case.
func openCheckpoint(ctx context.Context, rawURL string) (c *loader.Checkpoint, resolvedFrom string, err error) {
	st, err := openStore(ctx, rawURL)
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
			return nil, "", orNoSuchPath(ctx, st, bad(err))
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

// crcHex is the one representation of a CRC32C in output: 8 lowercase hex
// digits.
func crcHex(c uint32) string { return fmt.Sprintf("%08x", c) }

type inspectBytes struct {
	Key      string `json:"key"`
	Object   string `json:"object"`
	Offset   int64  `json:"offset"`
	Length   int64  `json:"length"`
	CRC32C   string `json:"crc32c,omitempty"`
	Encoding string `json:"encoding,omitempty"`
}

type inspectObject struct {
	Key   string `json:"key"`
	Bytes int64  `json:"bytes"`
}

type inspectTensor struct {
	Key    string         `json:"key"`
	DType  string         `json:"dtype"`
	Shape  []int64        `json:"shape"`
	Bytes  int64          `json:"bytes"`
	SHA256 string         `json:"sha256,omitempty"`
	Chunks []inspectChunk `json:"chunks"`
}

// inspectOutput is the --json document of ckpt inspect.
type inspectOutput struct {
	header
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
	Values        []inspectBytes         `json:"values"`
	Objects       []inspectObject        `json:"objects"`
	Bytes         int64                  `json:"bytes"`
}

func newInspectCmd() *cobra.Command {
	var asJSON, hash bool
	cmd := &cobra.Command{
		Use:   "inspect URL",
		Short: "List a checkpoint (or a run's newest committed checkpoint) key by key",
		Long: `Lists the checkpoint at URL (ckptkit's format or a PyTorch DCP checkpoint;
a run URL stands for its newest valid checkpoint) key by key: dtype,
global shape, chunks and the objects holding them, byte values (scheduler,
RNG state), the data objects and the training state (iteration, optimizer,
scheduler). --hash adds each tensor's SHA-256 over its row-major
little-endian bytes, reading every byte (with progress on a terminal).
Exit 3 when nothing is stored under URL ("no such path"), 1 when what is
there is not a readable checkpoint.`,
		Example: `  ckpt inspect ./runs/demo/step-00000012
  ckpt inspect ./runs/demo            # the newest valid checkpoint of the run
  ckpt inspect --hash --json s3://bucket/runs/demo/step-00000012`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, from, err := openCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			var p *progress
			if hash {
				p = newProgress(cmd, "inspect")
			}
			out, err := describe(ctx, c, from, hash, p.callback())
			p.finish()
			if err != nil {
				return bad(err)
			}
			if asJSON {
				emit(cmd, out)
				return nil
			}
			printInspect(cmd.OutOrStdout(), out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&hash, "hash", false, "add each tensor's SHA-256 over its row-major little-endian bytes (reads every byte)")
	return cmd
}

// describe lists c; with hash it reads every tensor, calling progress
// (when not nil) with the tensor bytes hashed so far.
func describe(ctx context.Context, c *loader.Checkpoint, from string, hash bool, progress func(done, total int64)) (*inspectOutput, error) {
	md := c.Metadata()
	out := &inspectOutput{URL: c.URL(), ResolvedFrom: from, Format: c.FormatName(), Version: md.Version, Writer: md.Writer,
		CreatedAt: md.CreatedAt, WorldSize: md.WorldSize, MetadataKey: c.MetadataKey(), MetadataBytes: c.MetadataSize(),
		Training: md.Training, Values: []inspectBytes{}, Objects: []inspectObject{}, Tensors: []inspectTensor{}}
	for _, o := range md.Objects {
		out.Bytes += o.Size
		out.Objects = append(out.Objects, inspectObject{Key: o.Key, Bytes: o.Size})
	}
	for _, b := range md.Bytes {
		ib := inspectBytes{Key: b.Key, Object: b.Object, Offset: b.Offset, Length: b.Length, Encoding: b.Encoding}
		if b.Encoding == metadata.EncodingRaw {
			ib.CRC32C = crcHex(b.CRC32C)
		}
		out.Values = append(out.Values, ib)
	}
	var hashTotal, hashed int64
	if hash {
		for _, te := range md.Tensors {
			n := metadata.ElementSize(te.DType)
			for _, d := range te.Shape {
				n *= d
			}
			hashTotal += n
		}
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
				ic.CRC32C = crcHex(ch.CRC32C)
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
			hashed += it.Bytes
			if progress != nil {
				progress(hashed, hashTotal)
			}
		}
		out.Tensors = append(out.Tensors, it)
	}
	return out, nil
}

func printInspect(w io.Writer, o *inspectOutput) {
	if o.ResolvedFrom != "" {
		fmt.Fprintf(w, "run %s: newest committed checkpoint is %s\n", safe(o.ResolvedFrom), safe(o.URL))
	}
	fmt.Fprintf(w, "checkpoint %s\n", safe(o.URL))
	fmt.Fprintf(w, "format %s %s, written by %s", safe(o.Format), safe(o.Version), safe(o.Writer))
	if !o.CreatedAt.IsZero() {
		fmt.Fprintf(w, " at %s", o.CreatedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, ", world size %d\n", o.WorldSize)
	tr := o.Training
	fmt.Fprintf(w, "training: iteration %d, optimizer %s (prefix %q, slots %v, %d state entries), scheduler prefix %q\n",
		tr.Iteration, safe(tr.Optimizer), tr.OptimizerPrefix, safeAll(tr.OptimizerSlots), tr.OptimizerStateEntries, tr.SchedulerPrefix)
	fmt.Fprintf(w, "%d tensors, %d byte values, %d objects, %d data bytes, metadata %s (%d bytes)\n\n", len(o.Tensors), len(o.Values), len(o.Objects), o.Bytes, safe(o.MetadataKey), o.MetadataBytes)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tDTYPE\tSHAPE\tCHUNKS\tOBJECTS\tBYTES\tSHA256")
	for _, t := range o.Tensors {
		objs := map[string]bool{}
		for _, c := range t.Chunks {
			objs[c.Object] = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t%d\t%s\n", safe(t.Key), safe(t.DType), t.Shape, len(t.Chunks), len(objs), t.Bytes, t.SHA256)
	}
	for _, b := range o.Values {
		fmt.Fprintf(tw, "%s\tbytes\t-\t1\t1\t%d\t\n", safe(b.Key), b.Length)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nOBJECTS")
	for _, ob := range o.Objects {
		fmt.Fprintf(w, "  %s  %d bytes\n", safe(ob.Key), ob.Bytes)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	prog "github.com/ckptkit/ckptkit/progress"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// openCheckpoint opens the checkpoint at rawURL, or, when rawURL is a run
// prefix, its newest committed valid checkpoint (run.Choose, the one rule).
// resolved is the run URL in the second case.
func openCheckpoint(ctx context.Context, rawURL string) (c *loader.Checkpoint, resolvedFrom string, err error) {
	st, err := openStore(ctx, rawURL)
	if err != nil {
		return nil, "", err
	}
	ch, err := ckrun.Choose(ctx, st, ckrun.LatestOptions{})
	switch {
	case errors.Is(err, ckrun.ErrNothingStored):
		return nil, "", &pathError{url: st.String()}
	case err != nil:
		return nil, "", err
	case ch.Checkpoint == nil:
		// A run without a committed checkpoint: nothing to inspect.
		return nil, "", orNoSuchPath(ctx, st, bad(ch.NotACheckpoint))
	}
	// inspect never copies the metadata object: only its decoded form is
	// kept (a huge object would otherwise be held twice).
	ch.Checkpoint.ReleaseRawMetadata()
	if ch.Run != nil {
		resolvedFrom = st.String()
	}
	return ch.Checkpoint, resolvedFrom, nil
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

	// md is the metadata whose tensors streamJSON writes (Tensors stays
	// empty), sums their SHA-256 with --hash.
	md   *metadata.Checkpoint
	sums [][sha256.Size]byte
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
			if !asJSON {
				// Streamed: one row at a time, nothing kept per tensor.
				err := printInspect(ctx, cmd.OutOrStdout(), c, from, hash, p.callback())
				p.finish()
				return bad(err)
			}
			out, err := describe(ctx, c, from, hash, p.callback())
			p.finish()
			if err != nil {
				return bad(err)
			}
			emit(cmd, out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&hash, "hash", false, "add each tensor's SHA-256 over its row-major little-endian bytes (reads every byte)")
	return cmd
}

// describeHead returns c's inspect document without its tensors.
func describeHead(c *loader.Checkpoint, from string) *inspectOutput {
	md := c.Metadata()
	out := &inspectOutput{URL: c.URL(), ResolvedFrom: from, Format: c.FormatName(), Version: md.Version, Writer: md.Writer,
		CreatedAt: md.CreatedAt, WorldSize: md.WorldSize, MetadataKey: c.MetadataKey(), MetadataBytes: c.MetadataSize(),
		Training: md.Training, Values: make([]inspectBytes, 0, len(md.Bytes)), Objects: make([]inspectObject, 0, len(md.Objects)), Tensors: []inspectTensor{}}
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
	return out
}

// tensorBytes is the byte size of te's global shape.
func tensorBytes(te *metadata.TensorEntry) int64 {
	n := metadata.ElementSize(te.DType)
	for _, d := range te.Shape {
		n *= d
	}
	return n
}

// hashTensor returns the SHA-256 of te's bytes, streamed: memory does not
// follow tensor size.
func hashTensor(ctx context.Context, c *loader.Checkpoint, te *metadata.TensorEntry) (string, error) {
	h := sha256.New()
	if err := c.WriteTensor(ctx, te.Key, h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashProgress counts the tensor bytes hashed for progress (nil: no
// progress).
type hashProgress struct {
	fn          prog.Func
	done, total int64
}

func newHashProgress(md *metadata.Checkpoint, fn prog.Func) *hashProgress {
	p := &hashProgress{fn: fn}
	for i := range md.Tensors {
		p.total += tensorBytes(&md.Tensors[i])
	}
	return p
}

func (p *hashProgress) add(n int64) {
	p.done += n
	p.fn.Report(prog.Update{Done: p.done, Total: p.total, Unit: prog.Bytes})
}

// describe lists c (the --json document); with hash it reads every tensor,
// calling progress (when not nil) with the tensor bytes hashed so far. The
// tensors are not copied into the document: streamJSON writes them from
// the metadata one at a time.
func describe(ctx context.Context, c *loader.Checkpoint, from string, hash bool, progress prog.Func) (*inspectOutput, error) {
	md := c.Metadata()
	out := describeHead(c, from)
	out.md = md
	if hash {
		out.sums = make([][sha256.Size]byte, len(md.Tensors))
		hp := newHashProgress(md, progress)
		for i := range md.Tensors {
			h := sha256.New()
			if err := c.WriteTensor(ctx, md.Tensors[i].Key, h); err != nil {
				return nil, err
			}
			h.Sum(out.sums[i][:0])
			hp.add(tensorBytes(&md.Tensors[i]))
		}
	}
	return out, nil
}

// tensorJSON is the --json entry of tensor i of o's metadata, without its
// chunks (chunkJSON).
func (o *inspectOutput) tensorJSON(i int) inspectTensor {
	te := &o.md.Tensors[i]
	it := inspectTensor{Key: te.Key, DType: te.DType, Shape: te.Shape, Bytes: tensorBytes(te), Chunks: []inspectChunk{}}
	if o.sums != nil {
		it.SHA256 = hex.EncodeToString(o.sums[i][:])
	}
	return it
}

// chunkJSON is the --json entry of a chunk.
func chunkJSON(ch *metadata.Chunk) inspectChunk {
	ic := inspectChunk{Offsets: ch.Offsets, Sizes: ch.Sizes, Object: ch.Object, Offset: ch.Offset, Length: ch.Length, Encoding: ch.Encoding}
	if ch.Encoding == metadata.EncodingRaw {
		ic.CRC32C = crcHex(ch.CRC32C)
	}
	return ic
}

// tensorsMember and chunksMember are how a document without tensors and a
// tensor without chunks write them: the sequences cannot occur inside a
// string, whose quotes are escaped.
var (
	tensorsMember = []byte(`"tensors":[]`)
	chunksMember  = []byte(`"chunks":[]`)
	writerMember  = []byte(`"writer":""`)
)

// writeJSONStringContent writes s JSON-escaped as encodeJSON escapes it,
// without the quotes, one piece at a time (cut where a character starts,
// so the escapes are the same).
func writeJSONStringContent(w *bufio.Writer, s string, scratch *bytes.Buffer) error {
	const piece = 1 << 20
	for len(s) > 0 {
		n := min(piece, len(s))
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		scratch.Reset()
		if err := encodeJSON(scratch, s[:n]); err != nil {
			return err
		}
		q := bytes.TrimSuffix(scratch.Bytes(), []byte("\n"))
		if _, err := w.Write(q[1 : len(q)-1]); err != nil {
			return err
		}
		s = s[n:]
	}
	return nil
}

// spliceArray writes doc with the empty array member replaced by the
// elements each writes (nil: member not found).
func spliceArray(w *bufio.Writer, doc, member []byte, n int, each func(i int) error) error {
	at := bytes.Index(doc, member)
	if at < 0 {
		return fmt.Errorf("inspect: no %s in the document", member)
	}
	split := at + len(member) - 1
	w.Write(doc[:split])
	for i := range n {
		if i > 0 {
			w.WriteByte(',')
		}
		if err := each(i); err != nil {
			return err
		}
	}
	_, err := w.Write(doc[split:])
	return err
}

// streamJSON writes o as writeJSON would write it, each tensor and each
// chunk encoded on its own from the metadata (a copy of every chunk entry
// and the whole encoded document cost several times the metadata).
func (o *inspectOutput) streamJSON(w io.Writer) error {
	if o.md == nil {
		return encodeJSON(w, o)
	}
	head := *o
	head.Tensors = []inspectTensor{}
	head.Writer = "" // written in pieces below: the document sizes it
	var buf, elem bytes.Buffer
	if err := encodeJSON(&buf, &head); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	doc := buf.Bytes()
	at := bytes.Index(doc, writerMember)
	if at < 0 {
		return fmt.Errorf("inspect: no %s in the document", writerMember)
	}
	at += len(writerMember) - 1 // at the closing quote
	bw.Write(doc[:at])
	if err := writeJSONStringContent(bw, o.Writer, &elem); err != nil {
		return err
	}
	doc = doc[at:]
	// encode appends v's JSON without encodeJSON's newline to bw.
	encode := func(v any) error {
		elem.Reset()
		if err := encodeJSON(&elem, v); err != nil {
			return err
		}
		_, err := bw.Write(bytes.TrimSuffix(elem.Bytes(), []byte("\n")))
		return err
	}
	err := spliceArray(bw, doc, tensorsMember, len(o.md.Tensors), func(i int) error {
		it := o.tensorJSON(i)
		var tb bytes.Buffer
		if err := encodeJSON(&tb, &it); err != nil {
			return err
		}
		chunks := o.md.Tensors[i].Chunks
		return spliceArray(bw, bytes.TrimSuffix(tb.Bytes(), []byte("\n")), chunksMember, len(chunks), func(j int) error {
			ic := chunkJSON(&chunks[j])
			return encode(&ic)
		})
	})
	if err != nil {
		return err
	}
	return bw.Flush()
}

// distinctObjects counts the distinct objects of chunks without a map in
// the usual case of a few.
func distinctObjects(chunks []metadata.Chunk) int {
	var few [8]string
	seen := few[:0]
	var many map[string]bool
next:
	for i := range chunks {
		o := chunks[i].Object
		if many != nil {
			many[o] = true
			continue
		}
		for _, s := range seen {
			if s == o {
				continue next
			}
		}
		if len(seen) < len(few) {
			seen = append(seen, o)
			continue
		}
		many = make(map[string]bool, 2*len(few))
		for _, s := range seen {
			many[s] = true
		}
		many[o] = true
	}
	if many != nil {
		return len(many)
	}
	return len(seen)
}

// inspectCols is the number of aligned columns of the key table (the
// SHA256 column, last, is not padded).
const inspectCols = 6

// tensorCells returns the aligned cells of te's row.
func tensorCells(te *metadata.TensorEntry, cells *[inspectCols]string) {
	*cells = [inspectCols]string{safe(te.Key), safe(te.DType), fmt.Sprint(te.Shape), strconv.Itoa(len(te.Chunks)),
		strconv.Itoa(distinctObjects(te.Chunks)), strconv.FormatInt(tensorBytes(te), 10)}
}

// valueCells returns the aligned cells of a byte value's row.
func valueCells(b *metadata.BytesEntry, cells *[inspectCols]string) {
	*cells = [inspectCols]string{safe(b.Key), "bytes", "-", "1", "1", strconv.FormatInt(b.Length, 10)}
}

// printInspect prints c for a human: a header, then one row per key in
// columns aligned as text/tabwriter would align them (width: the longest
// cell plus 2), streamed: a first pass over the metadata measures the
// columns, the second prints each row as it is made (hashing its tensor
// first with hash), so memory does not follow the number of keys.
func printInspect(ctx context.Context, out io.Writer, c *loader.Checkpoint, from string, hash bool, progress prog.Func) error {
	md := c.Metadata()
	w := bufio.NewWriterSize(out, 64<<10)
	o := describeHead(c, from)
	if o.ResolvedFrom != "" {
		fmt.Fprintf(w, "run %s: newest committed checkpoint is %s\n", safe(o.ResolvedFrom), safe(o.URL))
	}
	fmt.Fprintf(w, "checkpoint %s\n", safe(o.URL))
	fmt.Fprintf(w, "format %s %s, written by ", safe(o.Format), safe(o.Version))
	w.WriteString(safe(o.Writer)) // not through fmt's buffer: the document sizes it
	if !o.CreatedAt.IsZero() {
		fmt.Fprintf(w, " at %s", o.CreatedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, ", world size %d\n", o.WorldSize)
	tr := o.Training
	fmt.Fprintf(w, "training: iteration %d, optimizer %s (prefix %q, slots %v, %d state entries), scheduler prefix %q\n",
		tr.Iteration, safe(tr.Optimizer), tr.OptimizerPrefix, safeAll(tr.OptimizerSlots), tr.OptimizerStateEntries, tr.SchedulerPrefix)
	fmt.Fprintf(w, "%d tensors, %d byte values, %d objects, %d data bytes, metadata %s (%d bytes)\n\n", len(md.Tensors), len(o.Values), len(o.Objects), o.Bytes, safe(o.MetadataKey), o.MetadataBytes)

	header := [inspectCols]string{"KEY", "DTYPE", "SHAPE", "CHUNKS", "OBJECTS", "BYTES"}
	var widths [inspectCols]int
	measure := func(cells *[inspectCols]string) {
		for j, s := range cells {
			widths[j] = max(widths[j], utf8.RuneCountInString(s)+2)
		}
	}
	var cells [inspectCols]string
	measure(&header)
	for i := range md.Tensors {
		tensorCells(&md.Tensors[i], &cells)
		measure(&cells)
	}
	for i := range md.Bytes {
		valueCells(&md.Bytes[i], &cells)
		measure(&cells)
	}
	row := func(cells *[inspectCols]string, last string) {
		for j, s := range cells {
			w.WriteString(s)
			for n := utf8.RuneCountInString(s); n < widths[j]; n++ {
				w.WriteByte(' ')
			}
		}
		w.WriteString(last)
		w.WriteByte('\n')
	}
	row(&header, "SHA256")
	hp := newHashProgress(md, progress)
	for i := range md.Tensors {
		te := &md.Tensors[i]
		sum := ""
		if hash {
			var err error
			if sum, err = hashTensor(ctx, c, te); err != nil {
				return err
			}
			hp.add(tensorBytes(te))
		}
		tensorCells(te, &cells)
		row(&cells, sum)
	}
	for i := range md.Bytes {
		valueCells(&md.Bytes[i], &cells)
		row(&cells, "")
	}
	fmt.Fprintln(w, "\nOBJECTS")
	for _, ob := range o.Objects {
		fmt.Fprintf(w, "  %s  %d bytes\n", safe(ob.Key), ob.Bytes)
	}
	return w.Flush()
}

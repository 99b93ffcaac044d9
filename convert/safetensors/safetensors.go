// Package safetensors writes a checkpoint as Hugging Face safetensors
// files: one "model.safetensors", or "model-NNNNN-of-NNNNN.safetensors"
// shards plus "model.safetensors.index.json" when the tensors exceed the
// shard size.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes
// of JSON header (padded with spaces so the data starts 8-byte aligned)
// mapping each tensor name to {"dtype", "shape", "data_offsets": [begin,
// end]} (offsets relative to the data, which follows the header) plus an
// optional "__metadata__" string map, then the tensors' row-major
// little-endian bytes.
//
// Conversion streams: headers are computed from the metadata alone, then
// each file is written as one Put of known size fed through a pipe by a
// goroutine that streams each tensor through loader.WriteTensor (chunks
// saved as whole rows through a small buffer, other layouts in bounded
// slabs; with a memory cap, those in row slabs within the cap), so memory
// follows neither the checkpoint nor a tensor's size.
package safetensors

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/progress"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// File names of the output.
const (
	// SingleFile is the name of an unsharded output.
	SingleFile = "model.safetensors"
	// IndexFile maps tensor names to shard files; it is written last.
	IndexFile = "model.safetensors.index.json"
)

// Errors Convert classifies with errors.Is.
var (
	// ErrDTypeNotRepresentable: a tensor's dtype has no safetensors name.
	ErrDTypeNotRepresentable = ckpterr.New(ckpterr.Unsupported, "dtype not representable in safetensors")
	// ErrTensorTooLarge: a tensor cannot be read within the memory cap.
	ErrTensorTooLarge = ckpterr.New(ckpterr.Usage, "tensor does not fit the memory cap")
	// ErrNameNotRepresentable: a tensor name a safetensors header cannot
	// hold as itself: invalid UTF-8 (JSON would turn it into U+FFFD, so
	// the file would name another tensor), the reserved "__metadata__", or
	// a name twice.
	ErrNameNotRepresentable = ckpterr.New(ckpterr.Unsupported, "tensor name not representable in safetensors")
	// ErrNoTensors: nothing to convert (for instance --model-only on a
	// checkpoint without model keys).
	ErrNoTensors = ckpterr.New(ckpterr.Usage, "no tensors to convert")
)

var dtypeNames = map[statedict.DType]string{
	statedict.Float32: "F32", statedict.Float16: "F16", statedict.BFloat16: "BF16", statedict.Float64: "F64",
	statedict.Int64: "I64", statedict.Int32: "I32", statedict.Int16: "I16", statedict.Int8: "I8",
	statedict.Uint8: "U8", statedict.Bool: "BOOL", statedict.Complex64: "C64",
}

// DTypeName returns the safetensors name of dt ("F32", "BF16", ...).
func DTypeName(dt statedict.DType) (string, bool) {
	n, ok := dtypeNames[dt]
	return n, ok
}

// Options tune Convert.
type Options struct {
	// ShardSize caps the tensor bytes of one file (0: a single file). A
	// tensor larger than ShardSize gets a file of its own.
	ShardSize int64
	// ModelOnly keeps only the model's keys ("<model prefix>.*", prefix
	// from the training-state record, default "model") and strips the
	// prefix, so names match the model's own state dict.
	ModelOnly bool
	// MaxMemory caps the conversion's memory (0: no cap). A tensor whose
	// chunks are raw and span whole rows (loader.StreamsChunks: what
	// ckptkit saves) is streamed in small pieces whatever the cap. Any
	// other tensor is read in row slabs (ranges of its first dimension, cut
	// at chunk boundaries) costing at most MaxMemory/4 bytes, counting the
	// slab and the stored chunks it touches (read whole, for their CRC32C
	// or to decode them); the other three quarters leave the garbage
	// collector room to free the previous slab (callers should also set
	// debug.SetMemoryLimit to the cap, as the CLI does). A tensor whose
	// smallest slab costs more fails with ErrTensorTooLarge before anything
	// is written. Without a cap such tensors go through
	// loader.WriteTensor's slabs (loader.SlabBytes plus the chunks a slab
	// touches).
	MaxMemory int64
	// Metadata is added to every file's "__metadata__".
	Metadata map[string]string
	// Progress, when set, is called after each tensor is written: the
	// tensor bytes written so far of the total (Unit progress.Bytes), the
	// tensor's name as Item and its size as Bytes.
	Progress progress.Func
}

// OutFile is one written file.
type OutFile struct {
	Name    string
	Size    int64
	Tensors int
}

// Result describes a conversion.
type Result struct {
	Files []OutFile
	// Index is IndexFile when the output is sharded, else "".
	Index   string
	Tensors int
	// TotalSize is the tensors' data bytes (the index's total_size).
	TotalSize int64
	// Skipped lists source keys not written: bytes values, which
	// safetensors cannot hold, and with ModelOnly the non-model keys.
	Skipped []string
}

type item struct {
	key, name, dtype string
	entry            *metadata.TensorEntry
	size             int64
	begin            int64 // offset in its file's data section
}

type file struct {
	name   string
	items  []item
	header []byte
	data   int64
}

func (f *file) size() int64 { return 8 + int64(len(f.header)) + f.data }

// Convert writes the tensors of src as safetensors files under dst. Files
// appear atomically (each is a single Put); a stale index (and, for
// sharded output, a stale model.safetensors) is deleted first and the
// index of a sharded output is written last, so a reader never sees an
// incomplete or mixed output described as complete.
func Convert(ctx context.Context, src *loader.Checkpoint, dst *backend.Store, opts Options) (*Result, error) {
	md := src.Metadata()
	res := &Result{Files: []OutFile{}, Skipped: []string{}}
	items, err := selectItems(md, opts.ModelOnly, &res.Skipped)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
	}
	for _, b := range md.Bytes {
		res.Skipped = append(res.Skipped, b.Key)
	}
	sort.Strings(res.Skipped)
	// Check every tensor fits the memory cap before writing anything.
	for _, it := range items {
		if streamed(it.entry, opts.MaxMemory) {
			continue
		}
		if _, err := slabs(it.entry, opts.MaxMemory/4); err != nil {
			return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
		}
	}
	files := pack(items, opts.ShardSize)
	meta := map[string]string{"format": "pt", "ckptkit.source_format": src.FormatName(),
		"ckptkit.iteration": strconv.FormatInt(md.Training.Iteration, 10)}
	for k, v := range opts.Metadata {
		meta[k] = v
	}
	for _, f := range files {
		if f.header, err = header(f.items, meta); err != nil {
			return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
		}
	}
	// A stale index (or, for sharded output, a stale single file, which
	// loaders prefer) would describe old and new files as one model.
	stale := []string{IndexFile}
	if len(files) > 1 {
		stale = append(stale, SingleFile)
	}
	for _, k := range stale {
		if err := dst.Delete(ctx, k); err != nil {
			return nil, fmt.Errorf("convert %s: remove stale %s: %w", src.URL(), k, err)
		}
	}
	for _, it := range items {
		res.TotalSize += it.size
	}
	w := &writer{src: src, dst: dst, opts: opts, totalBytes: res.TotalSize}
	for _, f := range files {
		if err := w.writeFile(ctx, f); err != nil {
			return nil, fmt.Errorf("convert %s to %s: %w", src.URL(), dst.URL(f.name), err)
		}
		res.Files = append(res.Files, OutFile{Name: f.name, Size: f.size(), Tensors: len(f.items)})
		res.Tensors += len(f.items)
	}
	if len(files) > 1 {
		idx, err := indexJSON(files, res.TotalSize)
		if err != nil {
			return nil, err
		}
		if err := dst.PutBytes(ctx, IndexFile, idx, backend.PutOptions{ContentType: "application/json"}); err != nil {
			return nil, fmt.Errorf("convert %s: write index: %w", src.URL(), err)
		}
		res.Index = IndexFile
	}
	return res, nil
}

func selectItems(md *metadata.Checkpoint, modelOnly bool, skipped *[]string) ([]item, error) {
	prefix := md.Training.ModelPrefix
	if prefix == "" {
		prefix = statedict.DefaultModelPrefix
	}
	var items []item
	for i := range md.Tensors {
		te := &md.Tensors[i]
		name := te.Key
		if modelOnly {
			rest, ok := strings.CutPrefix(te.Key, prefix+".")
			if !ok {
				*skipped = append(*skipped, te.Key)
				continue
			}
			name = rest
		}
		dt := statedict.DType(te.DType)
		st, ok := DTypeName(dt)
		if !ok {
			return nil, fmt.Errorf("tensor %q: %w: %q", te.Key, ErrDTypeNotRepresentable, te.DType)
		}
		n := statedict.NumElements(te.Shape)
		if n < 0 {
			return nil, fmt.Errorf("tensor %q: invalid shape %v", te.Key, te.Shape)
		}
		items = append(items, item{key: te.Key, name: name, dtype: st, entry: te, size: n * int64(dt.Size())})
	}
	if len(items) == 0 {
		return nil, ErrNoTensors
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })
	return items, nil
}

// pack assigns items to files in name order, starting a new file when the
// next tensor would overflow shardSize.
func pack(items []item, shardSize int64) []*file {
	var files []*file
	cur := &file{}
	for _, it := range items {
		if shardSize > 0 && len(cur.items) > 0 && cur.data+it.size > shardSize {
			files = append(files, cur)
			cur = &file{}
		}
		it.begin = cur.data
		cur.items = append(cur.items, it)
		cur.data += it.size
	}
	files = append(files, cur)
	if len(files) == 1 {
		files[0].name = SingleFile
		return files
	}
	for i, f := range files {
		f.name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(files))
	}
	return files
}

// metadataKey is the header's reserved member for the string metadata.
const metadataKey = "__metadata__"

type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// header returns the JSON header of a file holding items at their offsets,
// padded with spaces to a multiple of 8 bytes.
func header(items []item, meta map[string]string) ([]byte, error) {
	h := make(map[string]any, len(items)+1)
	for _, it := range items {
		switch _, dup := h[it.name]; {
		case !utf8.ValidString(it.name):
			return nil, fmt.Errorf("tensor %q: %w: invalid UTF-8", it.key, ErrNameNotRepresentable)
		case it.name == metadataKey:
			return nil, fmt.Errorf("tensor %q: %w: %q is the header's metadata member", it.key, ErrNameNotRepresentable, metadataKey)
		case dup:
			return nil, fmt.Errorf("tensor %q: %w: %q names two tensors", it.key, ErrNameNotRepresentable, it.name)
		}
		shape := it.entry.Shape
		if shape == nil {
			shape = []int64{}
		}
		h[it.name] = headerEntry{DType: it.dtype, Shape: shape, DataOffsets: [2]int64{it.begin, it.begin + it.size}}
	}
	if len(meta) > 0 {
		h[metadataKey] = meta
	}
	js, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode safetensors header: %w", err)
	}
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, strings.Repeat(" ", pad)...)
	}
	return js, nil
}

func indexJSON(files []*file, total int64) ([]byte, error) {
	wm := map[string]string{}
	for _, f := range files {
		for _, it := range f.items {
			wm[it.name] = f.name
		}
	}
	idx := map[string]any{"metadata": map[string]int64{"total_size": total}, "weight_map": wm}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode index: %w", err)
	}
	return append(js, '\n'), nil
}

type writer struct {
	src        *loader.Checkpoint
	dst        *backend.Store
	opts       Options
	bytes      int64
	totalBytes int64
}

// writeFile streams one file into a single Put of known size.
func (w *writer) writeFile(ctx context.Context, f *file) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	fed := make(chan error, 1)
	go func() {
		err := w.feed(ctx, pw, f)
		pw.CloseWithError(err)
		fed <- err
	}()
	err := w.dst.Put(ctx, f.name, f.size(), pr, backend.PutOptions{ContentType: "application/octet-stream"})
	// Unblock the feeder if the Put stopped reading early.
	pr.CloseWithError(errors.New("upload ended"))
	cancel()
	ferr := <-fed
	if err != nil {
		return err
	}
	return ferr
}

// feed writes the file's bytes: length, header, then each tensor.
func (w *writer) feed(ctx context.Context, out io.Writer, f *file) error {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(f.header)))
	if _, err := out.Write(n[:]); err != nil {
		return err
	}
	if _, err := out.Write(f.header); err != nil {
		return err
	}
	for _, it := range f.items {
		if err := w.writeTensor(ctx, out, it); err != nil {
			return err
		}
		w.bytes += it.size
		w.opts.Progress.Report(progress.Update{Done: w.bytes, Total: w.totalBytes, Unit: progress.Bytes, Item: it.name, Bytes: it.size})
	}
	return nil
}

// streamed reports whether te is written through loader.WriteTensor:
// always without a memory cap, and with one when the loader streams te's
// chunks in small pieces.
func streamed(te *metadata.TensorEntry, maxMemory int64) bool {
	return maxMemory <= 0 || loader.StreamsChunks(te)
}

func (w *writer) writeTensor(ctx context.Context, out io.Writer, it item) error {
	if it.size == 0 {
		return nil
	}
	if streamed(it.entry, w.opts.MaxMemory) {
		cw := &countingWriter{w: out}
		if err := w.src.WriteTensor(ctx, it.key, cw); err != nil {
			return err
		}
		if cw.n != it.size {
			return fmt.Errorf("tensor %q: wrote %d bytes, header says %d", it.key, cw.n, it.size)
		}
		return nil
	}
	ranges, err := slabs(it.entry, w.opts.MaxMemory/4)
	if err != nil {
		return err
	}
	var written int64
	for _, r := range ranges {
		var data []byte
		if r == nil {
			t, err := w.src.ReadTensor(ctx, it.key)
			if err != nil {
				return err
			}
			data = t.Data
		} else {
			offs := make([]int64, len(it.entry.Shape))
			sizes := append([]int64(nil), it.entry.Shape...)
			offs[0], sizes[0] = r[0], r[1]-r[0]
			sh, err := w.src.ReadTensorRegion(ctx, it.key, offs, sizes)
			if err != nil {
				return err
			}
			data = sh.Data
		}
		if _, err := out.Write(data); err != nil {
			return err
		}
		written += int64(len(data))
	}
	if written != it.size {
		return fmt.Errorf("tensor %q: wrote %d bytes, header says %d", it.key, written, it.size)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// slabs splits a tensor into row ranges [lo, hi) of its first dimension
// whose cost (slab bytes plus the stored bytes of every chunk the slab
// touches, decoded size included for foreign encodings) stays within
// budget. It returns one nil range (read the tensor whole) when budget is
// 0 or the tensor is 0-dim. Slab boundaries fall on chunk boundaries.
func slabs(te *metadata.TensorEntry, budget int64) ([]*[2]int64, error) {
	elem := metadata.ElementSize(te.DType)
	if budget <= 0 || len(te.Shape) == 0 || te.Shape[0] == 0 {
		if budget > 0 {
			if c := wholeCost(te, elem); c > budget {
				return nil, fmt.Errorf("tensor %q: %w: needs %d bytes, the cap allows %d per read; raise --max-memory", te.Key, ErrTensorTooLarge, c, budget)
			}
		}
		return []*[2]int64{nil}, nil
	}
	rowBytes := elem
	for _, d := range te.Shape[1:] {
		rowBytes *= d
	}
	cuts := map[int64]bool{0: true, te.Shape[0]: true}
	for _, ch := range te.Chunks {
		if len(ch.Offsets) > 0 {
			cuts[ch.Offsets[0]] = true
			cuts[ch.Offsets[0]+ch.Sizes[0]] = true
		}
	}
	points := make([]int64, 0, len(cuts))
	for p := range cuts {
		points = append(points, p)
	}
	sort.Slice(points, func(i, j int) bool { return points[i] < points[j] })
	cost := func(lo, hi int64) int64 {
		c := (hi - lo) * rowBytes
		for _, ch := range te.Chunks {
			if len(ch.Offsets) > 0 && ch.Offsets[0] < hi && ch.Offsets[0]+ch.Sizes[0] > lo && ch.Sizes[0] > 0 {
				c += chunkCost(&ch, elem)
			}
		}
		return c
	}
	var out []*[2]int64
	lo := points[0]
	for i := 1; i < len(points); i++ {
		seg := points[i]
		if cost(points[i-1], seg) > budget {
			return nil, fmt.Errorf("tensor %q: %w: rows [%d,%d) need %d bytes (slab plus the stored chunks it touches), the cap allows %d per read; raise --max-memory",
				te.Key, ErrTensorTooLarge, points[i-1], seg, cost(points[i-1], seg), budget)
		}
		if cost(lo, seg) > budget {
			out = append(out, &[2]int64{lo, points[i-1]})
			lo = points[i-1]
		}
	}
	return append(out, &[2]int64{lo, points[len(points)-1]}), nil
}

func chunkCost(ch *metadata.Chunk, elem int64) int64 {
	c := ch.Length
	if ch.Encoding != metadata.EncodingRaw {
		c += statedict.NumElements(ch.Sizes) * elem
	}
	return c
}

func wholeCost(te *metadata.TensorEntry, elem int64) int64 {
	c := statedict.NumElements(te.Shape) * elem
	for i := range te.Chunks {
		c += chunkCost(&te.Chunks[i], elem)
	}
	return c
}

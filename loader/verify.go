package loader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/ckptkit/ckptkit/internal/crc32c"
	"github.com/ckptkit/ckptkit/progress"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// Finding is one problem (or piece of information) found by Verify.
type Finding struct {
	Rule    string
	Key     string
	Object  string
	Message string
}

// VerifyReport is the outcome of Verify.
type VerifyReport struct {
	URL       string
	Format    string
	Version   string
	Writer    string
	Iteration int64
	Deep      bool
	// Resumable is true when there are no problems.
	Resumable bool
	Problems  []Finding
	Info      []Finding
	// BytesChecked counts the bytes read by a deep verify.
	BytesChecked int64
	// NoChecksums: the checkpoint records no checksum for its items (a
	// DCP checkpoint torch saved with compute_crc32 = False, see
	// metadata.Checkpoint.NoChecksums); a deep verify read and decoded
	// every item but could not detect a flipped data byte.
	NoChecksums bool
	// LazyParams are the checkpoint's parameters without optimizer state
	// (rule lazy-optimizer-state), sorted; never buffers when the
	// checkpoint records its parameter set (see TrainingState.Params).
	LazyParams []string
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// Deep reads every byte and checks every CRC32C (or decodes foreign
	// chunks).
	Deep bool
	// OptimizerPrefix defaults to the checkpoint's training-state record,
	// then to statedict.DefaultOptimizerPrefix.
	OptimizerPrefix string
	// OptimizerSlots is ignored: each parameter's slots are judged by the
	// checkpoint's slot census, or the subset rule (docs/RESUME.md).
	//
	// Deprecated: slot names are read from the keys, for any optimizer.
	OptimizerSlots []string
	// Concurrency bounds concurrent reads of a deep verify (default 8).
	Concurrency int
	// Progress, when set, is called during a deep verify with the bytes
	// checked so far (Unit progress.Bytes), from several goroutines.
	Progress progress.Func
}

// Verify is the pre-flight check before a resume: it reads the metadata
// once and reports every problem by rule name. The error is non-nil only
// for access errors; a bad or incomplete checkpoint is a report with
// Resumable false.
func Verify(ctx context.Context, st *backend.Store, opts VerifyOptions) (*VerifyReport, error) {
	rep := &VerifyReport{URL: st.String(), Deep: opts.Deep, Problems: []Finding{}, Info: []Finding{}, LazyParams: []string{}}
	c, err := Open(ctx, st)
	switch {
	case errors.Is(err, ErrIncomplete), errors.Is(err, ErrNoCheckpoint):
		rep.Problems = append(rep.Problems, Finding{Rule: RuleUncommitted, Message: err.Error()})
		return rep, nil
	case err != nil:
		return nil, err
	}
	// The checkpoint is not handed out: its metadata bytes are not needed
	// once decoded (a huge object would otherwise be held twice).
	c.ReleaseRawMetadata()
	if err := c.VerifyInto(ctx, rep, opts); err != nil {
		return nil, err
	}
	return rep, nil
}

// Verify checks the open checkpoint as the package-level Verify does,
// without reading its metadata again.
func (c *Checkpoint) Verify(ctx context.Context, opts VerifyOptions) (*VerifyReport, error) {
	rep := &VerifyReport{URL: c.URL(), Deep: opts.Deep, Problems: []Finding{}, Info: []Finding{}, LazyParams: []string{}}
	if err := c.VerifyInto(ctx, rep, opts); err != nil {
		return nil, err
	}
	return rep, nil
}

// VerifyInto checks an open checkpoint and appends to rep.
func (c *Checkpoint) VerifyInto(ctx context.Context, rep *VerifyReport, opts VerifyOptions) error {
	md := c.md
	rep.Format, rep.Version, rep.Writer, rep.Iteration = c.format.Name, md.Version, md.Writer, md.Training.Iteration
	rep.NoChecksums = md.NoChecksums
	prefix := opts.OptimizerPrefix
	if prefix == "" {
		prefix = md.Training.OptimizerPrefix
	}
	if prefix == "" {
		prefix = statedict.DefaultOptimizerPrefix
	}
	add := func(f Finding) { rep.Problems = append(rep.Problems, f) }

	// Objects: one listing, compared against the metadata.
	sizes := map[string]int64{}
	if err := c.store.List(ctx, "", func(o backend.ObjectInfo) error {
		sizes[o.Key] = o.Size
		return nil
	}); err != nil {
		return fmt.Errorf("verify %s: %w", c.URL(), err)
	}
	missingObj := map[string]bool{}
	for _, o := range md.Objects {
		got, ok := sizes[o.Key]
		switch {
		case !ok:
			missingObj[o.Key] = true
			add(Finding{Rule: RuleMissingObject, Object: c.store.URL(o.Key), Message: fmt.Sprintf("data object %s is missing", c.store.URL(o.Key))})
		case got != o.Size:
			missingObj[o.Key] = true
			add(Finding{Rule: RuleObjectSize, Object: c.store.URL(o.Key), Message: fmt.Sprintf("data object %s is %d bytes, metadata says %d", c.store.URL(o.Key), got, o.Size)})
		}
	}

	// Shard coverage.
	for i := range md.Tensors {
		if err := planner.CheckCoverage(&md.Tensors[i]); err != nil {
			add(Finding{Rule: RuleShardCoverage, Key: md.Tensors[i].Key, Message: err.Error()})
		}
	}

	// Optimizer state: partial, lazily absent, layout, per parameter:
	// exactly by the slot census when the writer recorded one, otherwise
	// by the subset rule within each param group (docs/RESUME.md).
	statePrefix := statedict.StatePrefix(prefix)
	modelPrefix := md.Training.ModelPrefix
	if modelPrefix == "" {
		modelPrefix = statedict.DefaultModelPrefix
	}
	params := savedSlots(md, stateKeys(md, prefix, modelPrefix))
	switch md.Training.Optimizer {
	case metadata.OptimizerOmitted:
		rep.Info = append(rep.Info, Finding{Rule: RuleOptimizerOmitted, Message: "optimizer state was deliberately not saved; a resume restores iteration and scheduler and starts the optimizer fresh"})
	case metadata.OptimizerSaved:
		partial, census := partialSaved(md, params)
		how := "the other parameters of its param group hold"
		if census {
			how = "the checkpoint's slot census records"
		}
		for _, fqn := range sortedKeys(partial) {
			var have, missing []string
			for _, s := range params[fqn] {
				have = append(have, statedict.StateKey(prefix, fqn, s))
			}
			for _, s := range partial[fqn] {
				missing = append(missing, statedict.StateKey(prefix, fqn, s))
			}
			add(Finding{Rule: RulePartialOptimizer, Key: statePrefix + fqn, Message: fmt.Sprintf("parameter %q has optimizer slots %s but lacks %s (which %s)", fqn, orNone(have), strings.Join(missing, ", "), how)})
		}
		lazy, matched := lazyParams(md, params, modelPrefix)
		entries := md.Training.OptimizerStateEntries
		if entries == 0 {
			for _, s := range params {
				entries += len(s)
			}
		}
		if entries > 0 && matched == 0 {
			var ck []string
			forEachKey(md, func(k string) {
				if len(ck) < 3 && !strings.HasPrefix(k, statedict.ModelKey(modelPrefix, "")) {
					ck = append(ck, k)
				}
			})
			add(Finding{Rule: RuleLayoutMismatch, Message: fmt.Sprintf("%d optimizer state entries recorded but none matches a model parameter under %q with prefix %q (checkpoint keys e.g. %s)", entries, modelPrefix, statePrefix, strings.Join(ck, ", "))})
		} else if len(lazy) > 0 {
			rep.LazyParams = lazy
			rep.Info = append(rep.Info, Finding{Rule: RuleLazyOptimizer, Message: fmt.Sprintf("%d parameters have no optimizer state (no gradient before the save); a resume starts their state fresh: %s", len(lazy), listSome(lazy))})
		}
	}

	if opts.Deep {
		n, problems, err := c.deepCheck(ctx, missingObj, opts.Concurrency, opts.Progress)
		if err != nil {
			return fmt.Errorf("verify %s: %w", c.URL(), err)
		}
		rep.BytesChecked = n
		rep.Problems = append(rep.Problems, problems...)
	}
	rep.Resumable = len(rep.Problems) == 0
	return nil
}

// lazyParams returns the checkpoint's parameters without any saved
// optimizer state (withState maps fqns to their saved slots), sorted, and
// how many parameters do have state. The parameters are the recorded
// parameter set (TrainingState.Params: buffers and parameters outside the
// optimizer are not in it); for checkpoints without the record, every
// model key is taken for a parameter.
func lazyParams(md *metadata.Checkpoint, withState map[string][]string, modelPrefix string) (lazy []string, matched int) {
	note := func(fqn string) {
		if _, has := withState[fqn]; has {
			matched++
		} else {
			lazy = append(lazy, fqn)
		}
	}
	if len(md.Training.Params) > 0 {
		for _, fqn := range md.Training.Params {
			note(fqn)
		}
		sort.Strings(lazy)
		return lazy, matched
	}
	for i := range md.Tensors {
		if fqn, ok := strings.CutPrefix(md.Tensors[i].Key, statedict.ModelKey(modelPrefix, "")); ok {
			note(fqn)
		}
	}
	return lazy, matched
}

// deepBatchChunks is how many chunks deepCheck plans and reads at a time:
// a plan of every chunk at once costs more memory than the metadata.
const deepBatchChunks = 1 << 16

// deepItem is one chunk (chunk -1: a bytes entry) deepCheck reads.
type deepItem struct {
	object         string
	offset, length int64
	entry, chunk   int32
}

// deepCheck reads every chunk of every present object and checks it, in
// batches of deepBatchChunks chunks, each read whole, in object order,
// adjacent ones coalesced: no load plan (its copies into targets are not
// needed here, and cost several times the chunk entries).
func (c *Checkpoint) deepCheck(ctx context.Context, skipObjects map[string]bool, conc int, report progress.Func) (int64, []Finding, error) {
	if conc <= 0 {
		conc = 8
	}
	md := c.md
	var total int64 // the bytes to read, for progress
	skipped := func(t *metadata.TensorEntry) bool {
		if planner.CheckCoverage(t) != nil {
			return true // reported as shard-coverage
		}
		for _, ch := range t.Chunks {
			if skipObjects[ch.Object] {
				return true
			}
		}
		return false
	}
	for i := range md.Tensors {
		if t := &md.Tensors[i]; !skipped(t) {
			for _, ch := range t.Chunks {
				if statedict.NumElements(ch.Sizes) > 0 {
					total += ch.Length
				}
			}
		}
	}
	var items []deepItem // grows up to deepBatchChunks, then is reused
	for i, b := range md.Bytes {
		if !skipObjects[b.Object] {
			total += b.Length
			items = append(items, deepItem{object: b.Object, offset: b.Offset, length: b.Length, entry: int32(i), chunk: -1})
		}
	}
	var read int64
	var out []Finding
	var checked atomic.Int64
	batch := func() error {
		n, found, err := c.deepCheckBatch(ctx, deepPlan(md, items), conc, &checked, total, report)
		read += n
		out = append(out, found...)
		items = items[:0]
		return err
	}
	for i := range md.Tensors {
		t := &md.Tensors[i]
		if skipped(t) {
			continue
		}
		for j := range t.Chunks {
			ch := &t.Chunks[j]
			if statedict.NumElements(ch.Sizes) == 0 {
				continue // no element: nothing stored
			}
			items = append(items, deepItem{object: ch.Object, offset: ch.Offset, length: ch.Length, entry: int32(i), chunk: int32(j)})
			if len(items) == deepBatchChunks {
				if err := batch(); err != nil {
					return 0, nil, err
				}
			}
		}
	}
	if len(items) > 0 {
		if err := batch(); err != nil {
			return 0, nil, err
		}
	}
	return read, out, nil
}

// deepPlan returns the reads of items: by object, then offset, each chunk
// whole, the next joining a read when it starts at or before the read's
// end and the read stays within planner.DefaultMaxReadBytes (a larger
// chunk is a read of its own).
func deepPlan(md *metadata.Checkpoint, items []deepItem) *planner.LoadPlan {
	slices.SortFunc(items, func(a, b deepItem) int {
		if c := strings.Compare(a.object, b.object); c != 0 {
			return c
		}
		return cmp.Compare(a.offset, b.offset)
	})
	plan := &planner.LoadPlan{}
	reads := make([]planner.ChunkRead, len(items))
	var starts []int
	for i, it := range items {
		n := len(plan.Ops)
		if n > 0 {
			op := &plan.Ops[n-1]
			end := op.Offset + op.Length
			if it.object == op.Object && it.offset <= end && max(end, it.offset+it.length)-op.Offset <= planner.DefaultMaxReadBytes {
				op.Length = max(end, it.offset+it.length) - op.Offset
				reads[i] = chunkRead(md, it, op.Offset)
				continue
			}
		}
		starts = append(starts, i)
		plan.Ops = append(plan.Ops, planner.ReadOp{Object: it.object, Offset: it.offset, Length: it.length})
		reads[i] = chunkRead(md, it, it.offset)
	}
	starts = append(starts, len(reads))
	for o := range plan.Ops {
		plan.Ops[o].Chunks = reads[starts[o]:starts[o+1]:starts[o+1]]
		plan.BytesRead += plan.Ops[o].Length
	}
	plan.BytesNeeded = plan.BytesRead
	return plan
}

// chunkRead is item it of a read that starts at opOffset.
func chunkRead(md *metadata.Checkpoint, it deepItem, opOffset int64) planner.ChunkRead {
	key := ""
	if it.chunk < 0 {
		key = md.Bytes[it.entry].Key
	} else {
		key = md.Tensors[it.entry].Key
	}
	return planner.ChunkRead{Key: key, Entry: int(it.entry), Chunk: int(it.chunk), Start: it.offset - opOffset, Length: it.length}
}

// deepCheckBatch reads and checks the chunks of plan; checked counts the
// bytes checked (of total) for progress.
func (c *Checkpoint) deepCheckBatch(ctx context.Context, plan *planner.LoadPlan, conc int, checked *atomic.Int64, total int64, report progress.Func) (int64, []Finding, error) {
	findings := make([][]Finding, len(plan.Ops))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	pool := readPool(plan, planner.DefaultMaxReadBytes) // conc reads hold one each
	for i := range plan.Ops {
		op := &plan.Ops[i]
		g.Go(func() error {
			if op.Length > int64(pool.Size()) && c.rawOp(op) {
				// One chunk larger than a read buffer: streamed through a
				// small buffer, so memory does not follow chunk size.
				for _, cr := range op.Chunks {
					if err := c.streamChunk(gctx, op, &cr); err != nil {
						if !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrInvalidBool) {
							return err
						}
						findings[i] = append(findings[i], Finding{Rule: RuleChecksum, Key: cr.Key, Object: c.store.URL(op.Object), Message: err.Error()})
					}
				}
				if report != nil {
					report(progress.Update{Done: checked.Add(op.Length), Total: total, Unit: progress.Bytes})
				}
				return nil
			}
			buf, err := pool.Get(gctx, int(op.Length))
			if err != nil {
				return err
			}
			defer pool.Put(buf)
			tap := &chunkTap{op: op, crcs: make([]uint32, len(op.Chunks))}
			if err := MissingObject(c.store.ReadRangeInto(gctx, op.Object, op.Offset, [][]byte{buf}, tap)); err != nil {
				return err
			}
			if report != nil {
				report(progress.Update{Done: checked.Add(op.Length), Total: total, Unit: progress.Bytes})
			}
			for j := range op.Chunks {
				cr := &op.Chunks[j]
				if _, err := c.verifyChunk(op, cr, buf[cr.Start:cr.Start+cr.Length], tap.crcs[j]); err != nil {
					findings[i] = append(findings[i], Finding{Rule: RuleChecksum, Key: cr.Key, Object: c.store.URL(op.Object), Message: err.Error()})
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, nil, err
	}
	var out []Finding
	for _, f := range findings {
		out = append(out, f...)
	}
	return plan.BytesRead, out, nil
}

// streamPiece is the buffer a streamed chunk check reads through.
const streamPiece = 4 << 20

// rawOp reports whether every chunk op reads is stored raw (CRC32C over
// the stored bytes, checkable piece by piece).
func (c *Checkpoint) rawOp(op *planner.ReadOp) bool {
	for _, cr := range op.Chunks {
		enc := ""
		if cr.Chunk >= 0 {
			enc = c.md.Tensors[cr.Entry].Chunks[cr.Chunk].Encoding
		} else {
			enc = c.md.Bytes[cr.Entry].Encoding
		}
		if enc != metadata.EncodingRaw {
			return false
		}
	}
	return true
}

// streamChunk checks a raw chunk's CRC32C (and bool bytes) reading it in
// streamPiece pieces: what verifyChunk checks, in bounded memory.
func (c *Checkpoint) streamChunk(ctx context.Context, op *planner.ReadOp, cr *planner.ChunkRead) error {
	var crc uint32
	var dtype string
	if cr.Chunk >= 0 {
		te := &c.md.Tensors[cr.Entry]
		crc, dtype = te.Chunks[cr.Chunk].CRC32C, te.DType
	} else {
		crc = c.md.Bytes[cr.Entry].CRC32C
	}
	where := func() string {
		return fmt.Sprintf("key %q in object %s at offset %d (%d bytes)", cr.Key, c.store.URL(op.Object), op.Offset+cr.Start, cr.Length)
	}
	return c.streamChecked(ctx, op.Object, op.Offset+cr.Start, cr.Length, crc, dtype, where, io.Discard)
}

// streamChecked copies length bytes of object from offset to w in
// streamPiece pieces, checking their CRC32C against crc and, for a bool
// dtype, that every byte is 0 or 1. where names the item in errors (called only then).
func (c *Checkpoint) streamChecked(ctx context.Context, object string, offset, length int64, crc uint32, dtype string, where func() string, w io.Writer) error {
	buf := make([]byte, min(int64(streamPiece), length))
	var got uint32
	for done := int64(0); done < length; {
		// One retried ranged read per piece (Store.ReadRange): a connection
		// cut in transit is transient and retried, only a short object is
		// a missing one.
		n := int(min(int64(len(buf)), length-done))
		if err := c.store.ReadRange(ctx, object, offset+done, buf[:n]); err != nil {
			return MissingObject(fmt.Errorf("%s: reading at byte %d of %d: %w", where(), done, length, err))
		}
		if dtype == string(statedict.Bool) {
			for j, b := range buf[:n] {
				if b > 1 {
					return fmt.Errorf("%w: %s: element %d of the chunk is 0x%02x", ErrInvalidBool, where(), done+int64(j), b)
				}
			}
		}
		got = crc32c.Update(got, buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		done += int64(n)
	}
	if got != crc {
		return fmt.Errorf("%w: %s: stored CRC32C %08x, computed %08x", ErrChecksum, where(), crc, got)
	}
	return nil
}

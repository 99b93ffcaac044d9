package loader

import (
	"context"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bufpool"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options tune a load. The zero value loads everything strictly with the
// default prefixes and AdamW's slot names.
type Options struct {
	// NoLoadOptimizer leaves every target key under OptimizerPrefix
	// untouched; iteration and scheduler are still restored.
	NoLoadOptimizer bool
	// ModelPrefix and OptimizerPrefix name the top-level key prefixes of
	// the target (defaults "model" and "optimizer"). Per-parameter state is
	// "<OptimizerPrefix>.state.<fqn>.<slot>".
	ModelPrefix, OptimizerPrefix string
	// OptimizerSlots are the per-parameter slot names (default AdamW's
	// "step", "exp_avg", "exp_avg_sq").
	OptimizerSlots []string
	// Frozen lists target keys (for example "model.fc1.bias") that may be
	// missing from the checkpoint: they are left untouched and reported.
	// Every other missing key fails the load.
	Frozen []string
	// Concurrency bounds concurrent read requests (default 8).
	Concurrency int
	// MaxReadBytes caps one coalesced read (default 8 MiB, so the read
	// buffers in flight stay near Concurrency x 8 MiB).
	MaxReadBytes int64
	// StagingLimit is the most data a transactional load stages in memory
	// before touching the targets (default 512 MiB). A larger load reads
	// twice instead: a verify pass (every CRC checked, nothing kept), then
	// a copy pass that checks every CRC again while filling the targets.
	StagingLimit int64
	// Direct fills the targets in one pass, with memory bounded by
	// Concurrency x MaxReadBytes: each read is checked against its CRC32C
	// before (or, when read straight into a contiguous target, right after)
	// it lands. It gives up transactionality for data errors only: every
	// resume rule is still checked before any I/O, but a read or checksum
	// failure midway leaves the targets partly filled (ErrTargetsPartlyFilled).
	// Use it when a failed load ends the process anyway.
	Direct bool
	// Logger receives the one summary line of a load that pruned lazy
	// state or skipped the optimizer (default slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.ModelPrefix == "" {
		o.ModelPrefix = statedict.DefaultModelPrefix
	}
	if o.OptimizerPrefix == "" {
		o.OptimizerPrefix = statedict.DefaultOptimizerPrefix
	}
	if len(o.OptimizerSlots) == 0 {
		o.OptimizerSlots = statedict.AdamWSlots()
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.MaxReadBytes <= 0 {
		o.MaxReadBytes = 8 << 20
	}
	if o.StagingLimit <= 0 {
		o.StagingLimit = 512 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Report says what a load did. It is returned once per load, whatever the
// number of ranks, and logged once when something was left fresh.
type Report struct {
	URL    string
	Format string
	// Iteration and OptimizerRecord come from the training-state record.
	Iteration       int64
	OptimizerRecord string
	// OptimizerLoaded is false when the optimizer was not read
	// (NoLoadOptimizer, or the checkpoint deliberately omitted it).
	OptimizerLoaded bool
	// LazyParams are the target's parameters (the fqns it asks optimizer
	// state for) whose optimizer state was wholly absent (lazily
	// initialised, resume rule 1); their target state was left untouched.
	// Buffers never appear: a target asks no optimizer state for them.
	// LazyKeys counts the target keys concerned.
	LazyParams []string
	LazyKeys   int
	// SkippedOptimizerKeys counts optimizer keys not loaded (rule 6).
	SkippedOptimizerKeys int
	// FrozenMissing are Frozen keys absent from the checkpoint.
	FrozenMissing []string
	// ExtraKeys are checkpoint keys no target asked for.
	ExtraKeys []string
	// KeysLoaded counts (rank, key) pairs filled.
	KeysLoaded int
	// BytesNeeded, BytesRead and ReadRequests describe the data reads
	// (BytesRead and ReadRequests count both passes of verify-then-copy).
	BytesNeeded, BytesRead int64
	ReadRequests           int
	// Mode is how the data was read: ModeStaged, ModeVerifyThenCopy or
	// ModeDirect.
	Mode     string
	Duration time.Duration
}

// Load modes reported in Report.Mode.
const (
	// ModeStaged: everything read and verified into memory, then copied.
	ModeStaged = "staged"
	// ModeVerifyThenCopy: a verify pass, then a verified copy pass.
	ModeVerifyThenCopy = "verify-then-copy"
	// ModeDirect: one pass, each read verified then copied (Options.Direct).
	ModeDirect = "direct"
)

// Summary is the one line logged for the load.
func (r *Report) Summary() string {
	var parts []string
	parts = append(parts, fmt.Sprintf("loaded %s at iteration %d (%d keys, %d bytes in %d requests)", r.URL, r.Iteration, r.KeysLoaded, r.BytesRead, r.ReadRequests))
	if len(r.LazyParams) > 0 {
		parts = append(parts, fmt.Sprintf("%d parameters had no optimizer state (never received a gradient before the save); their state starts fresh: %s", len(r.LazyParams), listSome(r.LazyParams)))
	}
	if !r.OptimizerLoaded {
		parts = append(parts, fmt.Sprintf("optimizer not loaded (checkpoint record: %s); %d optimizer keys left fresh", r.OptimizerRecord, r.SkippedOptimizerKeys))
	}
	if len(r.FrozenMissing) > 0 {
		parts = append(parts, fmt.Sprintf("%d frozen keys absent and left as they were: %s", len(r.FrozenMissing), listSome(r.FrozenMissing)))
	}
	if len(r.ExtraKeys) > 0 {
		parts = append(parts, fmt.Sprintf("%d checkpoint keys not requested: %s", len(r.ExtraKeys), listSome(r.ExtraKeys)))
	}
	return strings.Join(parts, "; ")
}

// Load opens the checkpoint at st and loads it into targets (one
// StateDict per local rank); see Checkpoint.Load.
func Load(ctx context.Context, st *backend.Store, targets []*statedict.StateDict, opts Options) (*Report, error) {
	c, err := Open(ctx, st)
	if err != nil {
		return nil, err
	}
	return c.Load(ctx, targets, opts)
}

// Load fills targets (one StateDict per local rank, tensors preallocated
// with the wanted dtype, global shape and chunk box; bytes keys present with
// any value) from the checkpoint. It is transactional: every resume rule is
// checked and every byte read and verified before any target buffer or map
// changes, so a failed load leaves targets exactly as they were. Reads of
// chunks wanted by several ranks happen once.
func (c *Checkpoint) Load(ctx context.Context, targets []*statedict.StateDict, opts Options) (*Report, error) {
	start := time.Now()
	opts.defaults()
	md := c.md
	d, err := decide(md, targets, &opts)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", c.URL(), err)
	}
	// Rule 4: every saved tensor must tile its shape exactly.
	for i := range md.Tensors {
		if err := planner.CheckCoverage(&md.Tensors[i]); err != nil {
			return nil, fmt.Errorf("load %s: %w", c.URL(), err)
		}
	}

	reqs := make([]planner.ReadRequest, 0, len(d.read))
	owners := make([]keyRef, 0, len(d.read))
	for _, ref := range d.read {
		sd := targets[ref.rank]
		if sh, ok := sd.Tensors[ref.key]; ok {
			if sh.NumElements() == 0 && len(sh.GlobalShape) > 0 {
				continue
			}
			reqs = append(reqs, planner.ReadRequest{Key: ref.key, Kind: planner.TensorItem, DType: string(sh.DType), Offsets: sh.Offsets, Sizes: sh.Sizes})
		} else {
			reqs = append(reqs, planner.ReadRequest{Key: ref.key, Kind: planner.BytesItem})
		}
		owners = append(owners, ref)
	}
	plan, err := planner.PlanLoad(md, reqs, planner.LoadOptions{MaxReadBytes: opts.MaxReadBytes})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", c.URL(), err)
	}

	ex := &executor{c: c, plan: plan, owners: owners, targets: targets, conc: opts.Concurrency, maxRead: opts.MaxReadBytes}
	mode := ModeStaged
	switch {
	case opts.Direct:
		mode = ModeDirect
		if err = ex.stream(ctx, true); err != nil {
			err = fmt.Errorf("%w (direct mode): %w", ErrTargetsPartlyFilled, err)
		}
	case plan.BytesRead > opts.StagingLimit:
		mode = ModeVerifyThenCopy
		if err = ex.stream(ctx, false); err == nil {
			// Every rule and every checksum passed; only a read failure (or
			// data changed under us) can stop the copy pass now.
			if err = ex.stream(ctx, true); err != nil {
				err = fmt.Errorf("%w (the copy pass failed after a complete verify pass): %w", ErrTargetsPartlyFilled, err)
			}
		}
	default:
		var staged [][][]byte
		if staged, err = c.readAll(ctx, plan, opts.Concurrency); err == nil {
			// Everything is verified: now, and only now, write into the targets.
			err = ex.applyAll(ctx, staged)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", c.URL(), err)
	}
	reads, bytesRead := len(plan.Ops), plan.BytesRead
	if mode == ModeVerifyThenCopy {
		reads, bytesRead = 2*reads, 2*bytesRead
	}

	rep := &Report{
		URL: c.URL(), Format: c.format.Name, Iteration: md.Training.Iteration, OptimizerRecord: md.Training.Optimizer,
		OptimizerLoaded: d.optimLoaded, LazyParams: d.lazyParams, LazyKeys: len(d.lazyKeys),
		SkippedOptimizerKeys: len(d.skippedOpt), FrozenMissing: d.frozen, ExtraKeys: d.extra,
		KeysLoaded: len(d.read), BytesNeeded: plan.BytesNeeded, BytesRead: bytesRead,
		ReadRequests: reads, Mode: mode, Duration: time.Since(start),
	}
	if len(d.lazyParams) > 0 || !d.optimLoaded || len(d.frozen) > 0 {
		opts.Logger.Info(rep.Summary())
	}
	return rep, nil
}

// readAll executes the plan's reads concurrently through the checkpoint's
// store and verifies (or decodes) every chunk. It returns, per op and
// chunk, the chunk's raw bytes.
func (c *Checkpoint) readAll(ctx context.Context, plan *planner.LoadPlan, conc int) ([][][]byte, error) {
	out := make([][][]byte, len(plan.Ops))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := range plan.Ops {
		op := &plan.Ops[i]
		g.Go(func() error {
			buf := make([]byte, op.Length)
			if err := c.readRange(gctx, op.Object, op.Offset, buf); err != nil {
				return err
			}
			chunks := make([][]byte, len(op.Chunks))
			for j, cr := range op.Chunks {
				raw, err := c.verifyChunk(op, &cr, buf[cr.Start:cr.Start+cr.Length])
				if err != nil {
					return err
				}
				chunks[j] = raw
			}
			out[i] = chunks
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// verifyChunk checks a raw chunk's CRC32C, or decodes a foreign one.
func (c *Checkpoint) verifyChunk(op *planner.ReadOp, cr *planner.ChunkRead, stored []byte) ([]byte, error) {
	var enc, dtype string
	var crc uint32
	var sizes []int64
	if cr.Chunk >= 0 {
		te := &c.md.Tensors[cr.Entry]
		ch := &te.Chunks[cr.Chunk]
		enc, crc, dtype, sizes = ch.Encoding, ch.CRC32C, te.DType, ch.Sizes
	} else {
		be := &c.md.Bytes[cr.Entry]
		enc, crc = be.Encoding, be.CRC32C
	}
	where := fmt.Sprintf("key %q in object %s at offset %d (%d bytes)", cr.Key, c.store.URL(op.Object), op.Offset+cr.Start, cr.Length)
	if enc == metadata.EncodingRaw {
		if got := crc32.Checksum(stored, castagnoli); got != crc {
			return nil, fmt.Errorf("%w: %s: stored CRC32C %08x, computed %08x", ErrChecksum, where, crc, got)
		}
		if err := checkBool(dtype, stored, where); err != nil {
			return nil, err
		}
		return stored, nil
	}
	// A foreign item with a recorded CRC32C (a DCP checkpoint written by
	// ckptkit, see torchdcp.ApplyIntegrity) is checked before decoding;
	// 0 means the format recorded none.
	if crc != 0 {
		if got := crc32.Checksum(stored, castagnoli); got != crc {
			return nil, fmt.Errorf("%w: %s: stored CRC32C %08x, computed %08x", ErrChecksum, where, crc, got)
		}
	}
	dec, err := metadata.Decoder(enc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	raw, err := dec(stored, dtype, sizes)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", where, err)
	}
	if cr.Chunk >= 0 {
		want := metadata.ElementSize(dtype)
		for _, d := range sizes {
			want *= d
		}
		if int64(len(raw)) != want {
			return nil, fmt.Errorf("decode %s: %d bytes, want %d for %s%v", where, len(raw), want, dtype, sizes)
		}
	}
	if err := checkBool(dtype, raw, where); err != nil {
		return nil, err
	}
	return raw, nil
}

// ErrInvalidBool: a bool tensor's bytes hold a value other than 0x00 or
// 0x01, the only two docs/FORMAT.md allows.
var ErrInvalidBool = ckpterr.New(ckpterr.BadCheckpoint, "bool tensor holds a byte other than 0 or 1")

// checkBool refuses raw bytes of a bool tensor chunk that are not 0 or 1.
func checkBool(dtype string, raw []byte, where string) error {
	if dtype != string(statedict.Bool) {
		return nil
	}
	for i, b := range raw {
		if b > 1 {
			return fmt.Errorf("%w: %s: element %d of the chunk is 0x%02x", ErrInvalidBool, where, i, b)
		}
	}
	return nil
}

// executor copies verified chunks of a plan into the targets.
type executor struct {
	c       *Checkpoint
	plan    *planner.LoadPlan
	owners  []keyRef
	targets []*statedict.StateDict
	conc    int
	maxRead int64
	pool    *bufpool.Pool

	mu   sync.Mutex
	sets []bytesSet // bytes values, applied last
}

type bytesSet struct {
	ref keyRef
	val []byte
}

// readPool returns the pool of a plan's read buffers: buffers the size of
// its largest read, at most limit, so a small checkpoint does not cost
// limit-sized buffers (a larger read gets a buffer of its own, or is
// streamed).
func readPool(plan *planner.LoadPlan, limit int64) *bufpool.Pool {
	var largest int64
	for i := range plan.Ops {
		largest = max(largest, plan.Ops[i].Length)
	}
	return bufpool.New(int(max(1, min(largest, limit))))
}

// stream reads op by op (memory bounded by conc ops), verifying every
// chunk; with fill it also copies them into the targets.
func (ex *executor) stream(ctx context.Context, fill bool) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(ex.conc)
	if ex.pool == nil {
		ex.pool = readPool(ex.plan, ex.maxRead) // shared by both passes; ex.conc reads hold one each
	}
	pool := ex.pool
	for i := range ex.plan.Ops {
		op := &ex.plan.Ops[i]
		g.Go(func() error {
			if fill {
				if dst, ok := ex.directTarget(op); ok {
					// Read straight into the target and check it there: one
					// copy, as a plain file read makes.
					if err := ex.c.readRange(gctx, op.Object, op.Offset, dst); err != nil {
						return err
					}
					_, err := ex.c.verifyChunk(op, &op.Chunks[0], dst)
					return err
				}
			}
			buf, err := pool.Get(gctx, int(op.Length))
			if err != nil {
				return err
			}
			defer pool.Put(buf)
			if err := ex.c.readRange(gctx, op.Object, op.Offset, buf); err != nil {
				return err
			}
			chunks := make([][]byte, len(op.Chunks))
			for j := range op.Chunks {
				cr := &op.Chunks[j]
				raw, err := ex.c.verifyChunk(op, cr, buf[cr.Start:cr.Start+cr.Length])
				if err != nil {
					return err
				}
				chunks[j] = raw
			}
			if !fill {
				return nil
			}
			return ex.applyOp(op, chunks)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if fill {
		ex.applyBytes()
	}
	return nil
}

// directTarget returns the target bytes an op can be read into directly:
// the op is one raw chunk copied whole into one target whose bytes for it
// are contiguous (a row shard into a row shard, say).
func (ex *executor) directTarget(op *planner.ReadOp) ([]byte, bool) {
	if len(op.Chunks) != 1 {
		return nil, false
	}
	cr := &op.Chunks[0]
	if cr.Chunk < 0 || len(cr.Copies) != 1 || cr.Start != 0 || cr.Length != op.Length {
		return nil, false
	}
	te := &ex.c.md.Tensors[cr.Entry]
	ch := &te.Chunks[cr.Chunk]
	cp := &cr.Copies[0]
	if ch.Encoding != metadata.EncodingRaw || !slices.Equal(cp.Offsets, ch.Offsets) || !slices.Equal(cp.Sizes, ch.Sizes) {
		return nil, false
	}
	ref := ex.owners[cp.Request]
	dst := ex.targets[ref.rank].Tensors[ref.key]
	start, n, ok := contiguous(dst.Offsets, dst.Sizes, cp.Offsets, cp.Sizes)
	elem := metadata.ElementSize(te.DType)
	if !ok || n*elem != op.Length {
		return nil, false
	}
	return dst.Data[start*elem : (start+n)*elem], true
}

// contiguous tells whether the box (global offsets and sizes) occupies one
// contiguous run of a row-major chunk placed at offsets with extent sizes,
// and returns the run's first element and element count.
func contiguous(offsets, sizes, boxOffsets, boxSizes []int64) (start, n int64, ok bool) {
	d := len(sizes)
	// From the innermost dimension out, the box must span whole dimensions
	// until the first partial one; every dimension outside that must be 1.
	k := d - 1
	for k >= 0 && boxOffsets[k] == offsets[k] && boxSizes[k] == sizes[k] {
		k--
	}
	for j := 0; j < k; j++ {
		if boxSizes[j] != 1 {
			return 0, 0, false
		}
	}
	n = 1
	for j := range boxSizes {
		n *= boxSizes[j]
		start = start*sizes[j] + (boxOffsets[j] - offsets[j])
	}
	return start, n, true
}

// applyAll copies staged, verified chunks into the targets, ops in parallel.
func (ex *executor) applyAll(ctx context.Context, staged [][][]byte) error {
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(ex.conc)
	for i := range ex.plan.Ops {
		op := &ex.plan.Ops[i]
		g.Go(func() error { return ex.applyOp(op, staged[i]) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	ex.applyBytes()
	return nil
}

// applyOp copies one op's verified chunks into the target tensors; bytes
// values are queued for applyBytes (maps are not safe for concurrent writes).
func (ex *executor) applyOp(op *planner.ReadOp, chunks [][]byte) error {
	md := ex.c.md
	for j := range op.Chunks {
		cr := &op.Chunks[j]
		src := chunks[j]
		if cr.Chunk < 0 {
			ex.mu.Lock()
			for _, cp := range cr.Copies {
				ex.sets = append(ex.sets, bytesSet{ref: ex.owners[cp.Request], val: append([]byte(nil), src...)})
			}
			ex.mu.Unlock()
			continue
		}
		te := &md.Tensors[cr.Entry]
		ch := &te.Chunks[cr.Chunk]
		elem := int(metadata.ElementSize(te.DType))
		for _, cp := range cr.Copies {
			ref := ex.owners[cp.Request]
			dst := ex.targets[ref.rank].Tensors[ref.key]
			if err := statedict.CopyRegion(dst.Data, dst.Offsets, dst.Sizes, src, ch.Offsets, ch.Sizes, cp.Offsets, cp.Sizes, elem); err != nil {
				return fmt.Errorf("copy %q into rank %d: %w", ref.key, ref.rank, err)
			}
		}
	}
	return nil
}

func (ex *executor) applyBytes() {
	for _, s := range ex.sets {
		ex.targets[s.ref.rank].Bytes[s.ref.key] = s.val
	}
	ex.sets = nil
}

package loader

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bufpool"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

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
	// OptimizerSlots is ignored: each parameter's expected slots are the
	// ones its target holds (the resuming optimizer's fresh state), for
	// any optimizer (docs/RESUME.md).
	//
	// Deprecated: the target says which slots each parameter has.
	OptimizerSlots []string
	// ParamGroups, when not nil, are the param groups of the target's
	// optimizer, in order: the fqns of each group's parameters. A load
	// that loads the optimizer then checks them against the checkpoint's
	// "<OptimizerPrefix>.param_groups.<i>.params" values before any target
	// byte is written: another number of groups, or a group holding other
	// parameters (their order within a group does not matter), fails with
	// ErrLayoutMismatch naming the group and a few of the fqns that differ.
	// Those values (small bytes values) are then read twice, once for the
	// check and once into the targets that ask for them.
	ParamGroups [][]string
	// Frozen lists target keys (for example "model.fc1.bias") that may be
	// missing from the checkpoint: they are left untouched and reported.
	// Every other missing key fails the load.
	Frozen []string
	// Concurrency bounds concurrent read requests (default 8).
	Concurrency int
	// MaxReadBytes caps one coalesced read that goes through a buffer
	// (default 8 MiB, so the read buffers in flight stay near Concurrency x
	// 8 MiB).
	MaxReadBytes int64
	// InPlaceReadBytes caps one ranged read whose every byte lands in place
	// in the targets, so needs no buffer (default 64 MiB): consecutive such
	// reads of an object are merged up to it, fewer and larger requests, as
	// a plain read of the object makes; an object larger than it is still
	// read by several requests in parallel.
	InPlaceReadBytes int64
	// Transactional makes a load that fails on a read or checksum error
	// leave the targets exactly as they were, at the price of memory or a
	// second read: up to StagingLimit of data is staged in memory (verified)
	// before any target is touched; a larger load reads twice, a verify
	// pass (every CRC checked, nothing kept), then a copy pass that checks
	// every CRC again while filling the targets.
	//
	// Without it (the default) a load reads every byte once: each chunk
	// goes straight into its target when the target's bytes for it are
	// contiguous (or into a reused buffer of at most MaxReadBytes, then
	// into the target), and its CRC32C is computed piece by piece while
	// the bytes are still in the cache. Every rule that can be checked
	// from the metadata (partial state, layout, coverage, dtype, shape,
	// keys) is still checked before the first byte is read; a read or
	// checksum failure midway fails with ErrTargetsPartlyFilled (and
	// ErrChecksum naming key, object and offset), and the targets must
	// be reloaded, for example from an older checkpoint.
	Transactional bool
	// StagingLimit is the most data a Transactional load stages in memory
	// before touching the targets (default 512 MiB).
	StagingLimit int64
	// Direct is the one-pass load, now the default.
	//
	// Deprecated: one pass is the default; Direct has no effect. Use
	// Transactional for the old default.
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
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.MaxReadBytes <= 0 {
		o.MaxReadBytes = 8 << 20
	}
	if o.InPlaceReadBytes <= 0 {
		o.InPlaceReadBytes = 64 << 20
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
	// Mode is how the data was read: ModeDirect (the default),
	// ModeStaged or ModeVerifyThenCopy (Transactional).
	Mode     string
	Duration time.Duration
}

// Load modes reported in Report.Mode.
const (
	// ModeDirect: the default; one pass, each byte read once into its
	// target (or a reused buffer) and its CRC32C computed as it lands.
	ModeDirect = "direct"
	// ModeStaged: Transactional, everything read and verified into
	// memory, then copied.
	ModeStaged = "staged"
	// ModeVerifyThenCopy: Transactional above StagingLimit, a verify pass,
	// then a verified copy pass.
	ModeVerifyThenCopy = "verify-then-copy"
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
// any value) from the checkpoint. Every resume rule is checked before any
// data is read. By default every byte is then read once, straight into the
// targets, with its CRC32C computed as it arrives; a data error midway is
// ErrTargetsPartlyFilled. With Options.Transactional every byte is read and
// verified before any target buffer or map changes, so a failed load
// leaves targets exactly as they were. Reads of chunks wanted by several
// ranks happen once.
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
	// The param-group rule, the half that needs the groups' values: read
	// and compared before the first target byte is written.
	var preBytes int64
	var preReads int
	if d.optimLoaded && opts.ParamGroups != nil {
		if preBytes, preReads, err = c.checkParamGroups(ctx, &opts); err != nil {
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

	ex := &executor{c: c, plan: plan, owners: owners, targets: targets, conc: opts.Concurrency, maxRead: opts.MaxReadBytes, inPlace: opts.InPlaceReadBytes}
	mode := ModeDirect
	switch {
	case !opts.Transactional:
		if err = ex.stream(ctx, true); err != nil && ex.touched.Load() {
			err = fmt.Errorf("%w (%w; a transactional load keeps them intact: loader.Options.Transactional in Go, a checkpoint URL in ckptkit.torch.resume)", err, ErrTargetsPartlyFilled)
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
		mode = ModeStaged
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
	switch mode {
	case ModeVerifyThenCopy:
		reads, bytesRead = len(plan.Ops)+ex.requests, 2*bytesRead
	case ModeDirect:
		reads = ex.requests
	}
	reads, bytesRead = reads+preReads, bytesRead+preBytes

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
			chunks, err := c.readOp(gctx, op, buf)
			out[i] = chunks
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// readOp reads op into buf (op.Length bytes), computing every chunk's
// CRC32C while the bytes arrive, and returns each chunk's verified (or
// decoded) bytes.
func (c *Checkpoint) readOp(ctx context.Context, op *planner.ReadOp, buf []byte) ([][]byte, error) {
	chunks := make([][]byte, len(op.Chunks))
	for j := range op.Chunks {
		cr := &op.Chunks[j]
		chunks[j] = buf[cr.Start : cr.Start+cr.Length]
	}
	return chunks, c.readVerified(ctx, op, [][]byte{buf}, chunks, nil)
}

// readVerified reads op into segs (consecutive parts of the op's range
// whose lengths add up to op.Length; chunks[j] is where chunk j lands,
// inside them), computing every chunk's CRC32C while the bytes arrive,
// then checks each chunk; a foreign chunk's decoded bytes replace
// chunks[j]. opened, when not nil, is set once the read is open, before
// any byte lands.
func (c *Checkpoint) readVerified(ctx context.Context, op *planner.ReadOp, segs, chunks [][]byte, opened *atomic.Bool) error {
	tap := &chunkTap{op: op, crcs: make([]uint32, len(op.Chunks)), opened: opened}
	if err := MissingObject(c.store.ReadRangeInto(ctx, op.Object, op.Offset, segs, tap)); err != nil {
		return err
	}
	for j := range op.Chunks {
		raw, err := c.verifyChunk(op, &op.Chunks[j], chunks[j], tap.crcs[j])
		if err != nil {
			return err
		}
		chunks[j] = raw
	}
	return nil
}

// chunkTap computes the CRC32C of every chunk of a read op from the pieces
// of the read, in order (backend.Tap).
type chunkTap struct {
	op     *planner.ReadOp
	crcs   []uint32
	pos    int64 // bytes of the op seen so far
	first  int   // first chunk not yet complete (chunks are sorted by Start)
	opened *atomic.Bool
}

// Reset is called once the read is open, before its first byte.
func (t *chunkTap) Reset() {
	t.pos, t.first = 0, 0
	clear(t.crcs)
	if t.opened != nil {
		t.opened.Store(true)
	}
}

func (t *chunkTap) Write(p []byte) (int, error) {
	p0, p1 := t.pos, t.pos+int64(len(p))
	for j := t.first; j < len(t.op.Chunks) && t.op.Chunks[j].Start < p1; j++ {
		cr := &t.op.Chunks[j]
		if a, b := max(cr.Start, p0), min(cr.Start+cr.Length, p1); a < b {
			t.crcs[j] = crc32c.Update(t.crcs[j], p[a-p0:b-p0])
		}
		if j == t.first && cr.Start+cr.Length <= p1 {
			t.first++
		}
	}
	t.pos = p1
	return len(p), nil
}

// verifyChunk checks a raw chunk against its CRC32C (got, computed while
// it was read), or decodes a foreign one.
func (c *Checkpoint) verifyChunk(op *planner.ReadOp, cr *planner.ChunkRead, stored []byte, got uint32) ([]byte, error) {
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
	// Named only when something is wrong: formatting it for every chunk
	// cost more than checking a small one.
	where := func() string {
		return fmt.Sprintf("key %q in object %s at offset %d (%d bytes)", cr.Key, c.store.URL(op.Object), op.Offset+cr.Start, cr.Length)
	}
	if enc == metadata.EncodingRaw {
		if got != crc {
			return nil, fmt.Errorf("%w: %s: stored CRC32C %08x, computed %08x", ErrChecksum, where(), crc, got)
		}
		if dtype == string(statedict.Bool) {
			if err := checkBool(dtype, stored, where()); err != nil {
				return nil, err
			}
		}
		return stored, nil
	}
	// A foreign item with a recorded CRC32C (a DCP checkpoint written by
	// ckptkit, see torchdcp.ApplyIntegrity) is checked before decoding;
	// 0 means the format recorded none. got covers the stored bytes
	// whatever their encoding.
	if crc != 0 && got != crc {
		return nil, fmt.Errorf("%w: %s: stored CRC32C %08x, computed %08x", ErrChecksum, where(), crc, got)
	}
	dec, err := metadata.Decoder(enc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where(), err)
	}
	raw, err := dec(stored, dtype, sizes)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", where(), err)
	}
	if cr.Chunk >= 0 {
		want := metadata.ElementSize(dtype) * statedict.NumElements(sizes)
		if int64(len(raw)) != want {
			return nil, fmt.Errorf("decode %s: %d bytes, want %d for %s%v", where(), len(raw), want, dtype, sizes)
		}
	}
	if dtype == string(statedict.Bool) {
		if err := checkBool(dtype, raw, where()); err != nil {
			return nil, err
		}
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
	inPlace int64 // cap of a merged in-place read (0: no merging)
	pool    *bufpool.Pool
	// requests counts the ranged reads of the last fill pass.
	requests int

	// touched is set once any target byte may have been written (a read
	// into a target is open, or a buffered chunk is being copied).
	touched atomic.Bool

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
	ops := ex.plan.Ops
	if fill {
		ops = ex.mergeInPlace(ops)
		ex.requests = len(ops)
	}
	for i := range ops {
		op := &ops[i]
		g.Go(func() error {
			if fill {
				if segs, chunks, direct, ok := ex.scatter(op); ok {
					// Every chunk goes straight into its target (gaps and
					// chunks that cannot into a buffer, copied after), the
					// CRC computed as the bytes land: one copy, as a plain
					// file read makes.
					return ex.readScattered(gctx, op, segs, chunks, direct)
				}
			}
			buf, err := pool.Get(gctx, int(op.Length))
			if err != nil {
				return err
			}
			defer pool.Put(buf)
			chunks, err := ex.c.readOp(gctx, op, buf[:op.Length])
			if err != nil || !fill {
				return err
			}
			ex.touched.Store(true)
			return ex.applyOp(op, chunks, nil)
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

// mergeInPlace merges consecutive ops that read adjacent ranges of one
// object and land wholly in place (every chunk into its target, no gap)
// into reads of up to ex.inPlace bytes: without a buffer to bound, the
// only reason to split them is parallelism.
func (ex *executor) mergeInPlace(ops []planner.ReadOp) []planner.ReadOp {
	if ex.inPlace <= 0 || len(ops) < 2 {
		return ops
	}
	inPlace := func(op *planner.ReadOp) bool {
		var pos int64
		for j := range op.Chunks {
			cr := &op.Chunks[j]
			if cr.Start != pos {
				return false
			}
			if _, ok := ex.chunkTarget(cr); !ok {
				return false
			}
			pos += cr.Length
		}
		return pos == op.Length
	}
	out := make([]planner.ReadOp, 0, len(ops))
	open := false // whether out's last op may take more
	for i := range ops {
		op := ops[i]
		ok := inPlace(&op)
		if n := len(out); open && ok && out[n-1].Object == op.Object && out[n-1].Offset+out[n-1].Length == op.Offset &&
			out[n-1].Length+op.Length <= ex.inPlace {
			last := &out[n-1]
			for _, cr := range op.Chunks {
				cr.Start += last.Length
				last.Chunks = append(last.Chunks, cr)
			}
			last.Length += op.Length
			continue
		}
		if ok {
			op.Chunks = slices.Clone(op.Chunks) // appended to when merged
		}
		out = append(out, op)
		open = ok
	}
	return out
}

// scatter plans reading op straight into the targets: segs are the
// consecutive parts of the op's range (a target's bytes for a chunk, or a
// part of a pool buffer for gaps and for chunks that cannot be read in
// place), chunks[j] is where chunk j lands and direct[j] whether that is
// its target. ok is false when no chunk can be read in place (or chunks
// overlap): then the caller reads through a buffer.
func (ex *executor) scatter(op *planner.ReadOp) (segs, chunks [][]byte, direct []bool, ok bool) {
	direct = make([]bool, len(op.Chunks))
	dsts := make([][]byte, len(op.Chunks))
	var pos int64
	for j := range op.Chunks {
		cr := &op.Chunks[j]
		if cr.Start < pos {
			return nil, nil, nil, false
		}
		dsts[j], direct[j] = ex.chunkTarget(cr)
		ok = ok || direct[j]
		pos = cr.Start + cr.Length
	}
	if !ok {
		return nil, nil, nil, false
	}
	chunks = make([][]byte, len(op.Chunks))
	pos = 0
	for j := range op.Chunks {
		cr := &op.Chunks[j]
		if cr.Start > pos {
			segs = append(segs, nil) // a gap, filled in by readScattered
		}
		if direct[j] {
			chunks[j] = dsts[j]
		}
		segs = append(segs, chunks[j]) // nil: a buffered chunk
		pos = cr.Start + cr.Length
	}
	if pos < op.Length {
		segs = append(segs, nil)
	}
	return segs, chunks, direct, true
}

// readScattered reads op as scatter planned it: the nil segments (gaps
// and buffered chunks) get pool buffers, in op order; chunks not read in
// place are then copied into the targets.
func (ex *executor) readScattered(ctx context.Context, op *planner.ReadOp, segs, chunks [][]byte, direct []bool) error {
	if slices.ContainsFunc(segs, func(s []byte) bool { return s == nil }) {
		// The nil segments get their bytes from one pool buffer laid out
		// like the op's range.
		buf, err := ex.pool.Get(ctx, int(op.Length))
		if err != nil {
			return err
		}
		defer ex.pool.Put(buf)
		var pos int64
		si := 0
		for j := range op.Chunks {
			cr := &op.Chunks[j]
			if cr.Start > pos {
				segs[si] = buf[pos:cr.Start]
				si++
			}
			if !direct[j] {
				segs[si] = buf[cr.Start : cr.Start+cr.Length]
				chunks[j] = segs[si]
			}
			si++
			pos = cr.Start + cr.Length
		}
		if pos < op.Length {
			segs[si] = buf[pos:op.Length]
		}
	}
	if err := ex.c.readVerified(ctx, op, segs, chunks, &ex.touched); err != nil {
		return err
	}
	return ex.applyOp(op, chunks, direct)
}

// chunkTarget returns the target bytes a chunk can be read into in place:
// a raw chunk copied whole into one target whose bytes for it are
// contiguous (a row shard into a row shard, say).
func (ex *executor) chunkTarget(cr *planner.ChunkRead) ([]byte, bool) {
	if cr.Chunk < 0 || len(cr.Copies) != 1 {
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
	if !ok || n*elem != cr.Length {
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
		g.Go(func() error { return ex.applyOp(op, staged[i], nil) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	ex.applyBytes()
	return nil
}

// applyOp copies one op's verified chunks into the target tensors, except
// those marked in done (already read in place); bytes values are queued
// for applyBytes (maps are not safe for concurrent writes).
func (ex *executor) applyOp(op *planner.ReadOp, chunks [][]byte, done []bool) error {
	md := ex.c.md
	for j := range op.Chunks {
		if done != nil && done[j] {
			continue
		}
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

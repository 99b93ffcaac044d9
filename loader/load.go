package loader

import (
	"context"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
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
	// MaxReadBytes caps one coalesced read (default 64 MiB).
	MaxReadBytes int64
	// Logger receives the one summary line of a load that pruned lazy
	// state or skipped the optimizer (default slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.ModelPrefix == "" {
		o.ModelPrefix = "model"
	}
	if o.OptimizerPrefix == "" {
		o.OptimizerPrefix = "optimizer"
	}
	if len(o.OptimizerSlots) == 0 {
		o.OptimizerSlots = []string{"step", "exp_avg", "exp_avg_sq"}
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
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
	// LazyParams are the parameters (fqns) whose optimizer state was wholly
	// absent (lazily initialised, resume rule 1); their target state was
	// left untouched. LazyKeys counts the target keys concerned.
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
	// BytesNeeded, BytesRead and ReadRequests describe the data reads.
	BytesNeeded, BytesRead int64
	ReadRequests           int
	Duration               time.Duration
}

// Examples returns up to five of keys.
func Examples(keys []string) []string {
	if len(keys) > maxListed {
		return keys[:maxListed]
	}
	return keys
}

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

	staged, err := c.readAll(ctx, plan, opts.Concurrency)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", c.URL(), err)
	}

	// Everything is verified: now, and only now, write into the targets.
	if err := c.apply(ctx, plan, staged, reqs, owners, targets, opts.Concurrency); err != nil {
		return nil, fmt.Errorf("load %s: %w", c.URL(), err)
	}

	rep := &Report{
		URL: c.URL(), Format: c.format.Name, Iteration: md.Training.Iteration, OptimizerRecord: md.Training.Optimizer,
		OptimizerLoaded: d.optimLoaded, LazyParams: d.lazyParams, LazyKeys: len(d.lazyKeys),
		SkippedOptimizerKeys: len(d.skippedOpt), FrozenMissing: d.frozen, ExtraKeys: d.extra,
		KeysLoaded: len(d.read), BytesNeeded: plan.BytesNeeded, BytesRead: plan.BytesRead,
		ReadRequests: len(plan.Ops), Duration: time.Since(start),
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
			if err := c.store.ReadRange(gctx, op.Object, op.Offset, buf); err != nil {
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
		return stored, nil
	}
	dec, err := metadata.Decoder(enc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	raw, err := dec(stored, dtype, sizes)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", where, err)
	}
	return raw, nil
}

// apply copies the verified chunks into the targets.
func (c *Checkpoint) apply(ctx context.Context, plan *planner.LoadPlan, staged [][][]byte, reqs []planner.ReadRequest, owners []keyRef, targets []*statedict.StateDict, conc int) error {
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	type bytesSet struct {
		ref keyRef
		val []byte
	}
	var sets []bytesSet
	for i := range plan.Ops {
		op := &plan.Ops[i]
		for j := range op.Chunks {
			cr := &op.Chunks[j]
			src := staged[i][j]
			if cr.Chunk < 0 {
				for _, cp := range cr.Copies {
					sets = append(sets, bytesSet{ref: owners[cp.Request], val: append([]byte(nil), src...)})
				}
				continue
			}
			ch := &c.md.Tensors[cr.Entry].Chunks[cr.Chunk]
			elem := int(metadata.ElementSize(c.md.Tensors[cr.Entry].DType))
			g.Go(func() error {
				for _, cp := range cr.Copies {
					ref := owners[cp.Request]
					dst := targets[ref.rank].Tensors[ref.key]
					if err := statedict.CopyRegion(dst.Data, dst.Offsets, dst.Sizes, src, ch.Offsets, ch.Sizes, cp.Offsets, cp.Sizes, elem); err != nil {
						return fmt.Errorf("copy %q into rank %d: %w", ref.key, ref.rank, err)
					}
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, s := range sets {
		targets[s.ref.rank].Bytes[s.ref.key] = s.val
	}
	return nil
}

// Package saver writes a sharded checkpoint: every rank offers its
// statedict, rank 0 plans (deduplicating replicated items, balancing
// writers), every rank writes its data objects concurrently with a CRC32C
// per item, and rank 0 commits the metadata object last. A prefix without
// that metadata object is an incomplete checkpoint that loaders refuse.
package saver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/gob"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/ckptkit/ckptkit/ckpterr"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// Version is written into Checkpoint.Writer.
const Version = "ckptkit/0.1.0"

// Default key prefixes (the key schema is statedict's).
const (
	DefaultModelPrefix     = statedict.DefaultModelPrefix
	DefaultOptimizerPrefix = statedict.DefaultOptimizerPrefix
	DefaultSchedulerPrefix = statedict.DefaultSchedulerPrefix
)

// DefaultOptimizerSlots are AdamW's per-parameter state slots.
var DefaultOptimizerSlots = statedict.AdamWSlots()

// ErrCommitted is returned when the target prefix already holds a committed
// checkpoint and Options.Overwrite is false.
var ErrCommitted = ckpterr.New(ckpterr.Conflict, "a committed checkpoint already exists at this prefix")

// Options tune a save. The zero value saves everything with the defaults.
type Options struct {
	// Iteration is recorded in the training-state record.
	Iteration int64
	// NoSaveOptimizer leaves every key under OptimizerPrefix out of the
	// checkpoint; iteration and scheduler are still saved and the record
	// says the optimizer was deliberately omitted.
	NoSaveOptimizer bool
	// ModelPrefix, OptimizerPrefix and SchedulerPrefix name the top-level
	// key prefixes (defaults "model", "optimizer", "scheduler").
	ModelPrefix, OptimizerPrefix, SchedulerPrefix string
	// OptimizerSlots are recorded as training.optimizer_slots (default
	// AdamW's), for information only: what each parameter saved is recorded
	// from its keys (the slot census, docs/FORMAT.md), for any optimizer.
	OptimizerSlots []string
	// Params are the fqns of the parameters the optimizer updates (its
	// param groups' params), recorded in the training-state record so a
	// resume tells lazily absent parameters from buffers. When nil, they
	// are taken from rank 0's "<OptimizerPrefix>.param_groups.<i>.params"
	// byte values holding JSON lists of strings; without either the record
	// has none and readers take every model key for a parameter.
	Params []string
	// Overwrite replaces a committed checkpoint at the prefix (its metadata
	// is deleted first, so it is never half-valid).
	Overwrite bool
	// MaxObjectBytes splits a rank's data into several objects (0: one).
	MaxObjectBytes int64
	// Concurrency bounds a rank's concurrent object uploads (default 4).
	Concurrency int
}

func (o *Options) defaults() {
	if o.ModelPrefix == "" {
		o.ModelPrefix = DefaultModelPrefix
	}
	if o.OptimizerPrefix == "" {
		o.OptimizerPrefix = DefaultOptimizerPrefix
	}
	if o.SchedulerPrefix == "" {
		o.SchedulerPrefix = DefaultSchedulerPrefix
	}
	if len(o.OptimizerSlots) == 0 {
		o.OptimizerSlots = DefaultOptimizerSlots
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
}

// Result describes a committed save.
type Result struct {
	// URL is the checkpoint's (redacted) URL.
	URL string
	// Metadata is the committed metadata.
	Metadata *metadata.Checkpoint
	// BytesWritten counts data bytes written by all ranks (metadata excluded).
	BytesWritten int64
	// MetadataBytes is the metadata object's size.
	MetadataBytes int
	// Duration is the wall time of the save on the rank that returned it.
	Duration time.Duration
}

// SaveLocal saves the statedicts of len(sds) ranks running as goroutines of
// this process. It returns when the checkpoint is committed or has failed.
func SaveLocal(ctx context.Context, st *backend.Store, sds []*statedict.StateDict, opts Options) (*Result, error) {
	return saveRanks(ctx, st, sds, opts, nil, hooks{})
}

// hooks tell an asynchronous save's caller where the save stands: planned
// once every rank has the plan (never on a failure before it), staged once
// the caller's buffers are no longer read (also when the save fails before
// that). Nil hooks are not called.
type hooks struct {
	planned, staged func()
}

func (hooks) call(f func()) {
	if f != nil {
		f()
	}
}

// saveRanks runs save for len(sds) in-process ranks and returns rank 0's
// outcome (all ranks agree on it). Each hook is called once every rank has
// called its own.
func saveRanks(ctx context.Context, st *backend.Store, sds []*statedict.StateDict, opts Options, stg *staging, h hooks) (*Result, error) {
	coords := coordinator.NewLocal(len(sds))
	results := make([]*Result, len(sds))
	errs := make([]error, len(sds))
	done := make(chan int, len(sds))
	var unplanned, unstaged atomic.Int64
	unplanned.Store(int64(len(sds)))
	unstaged.Store(int64(len(sds)))
	rank := hooks{
		planned: func() {
			if unplanned.Add(-1) == 0 {
				h.call(h.planned)
			}
		},
		staged: func() {
			if unstaged.Add(-1) == 0 {
				h.call(h.staged)
			}
		},
	}
	if len(sds) == 0 {
		h.call(h.planned)
		h.call(h.staged)
	}
	for r := range sds {
		go func(r int) {
			results[r], errs[r] = save(ctx, st, coords[r], sds[r], opts, stg, rank)
			done <- r
		}(r)
	}
	for range sds {
		<-done
	}
	if errs[0] != nil {
		return nil, errs[0]
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results[0], nil
}

// The values Save exchanges cross machines when the coordinator does (see
// coordinator.NewStore): they are gob-registered and encode their errors
// as *coordinator.RemoteError, which keeps the message and the sentinels
// below for errors.Is. The in-process coordinator passes them by reference.
func init() {
	gob.Register(localOutcome{})
	gob.Register(planOutcome{})
	gob.Register(rankOutcome{})
	gob.Register(commitOutcome{})
	coordinator.RegisterError("saver.ErrCommitted", ErrCommitted)
	coordinator.RegisterError("planner.ErrInvalidPlan", planner.ErrInvalidPlan)
	coordinator.RegisterError("planner.ErrPlanMismatch", planner.ErrPlanMismatch)
	coordinator.RegisterError("planner.ErrKeyNotFound", planner.ErrKeyNotFound)
	coordinator.RegisterError("planner.ErrCoverage", planner.ErrCoverage)
}

func gobEncode(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return nil, fmt.Errorf("saver: encode %T: %w", v, err)
	}
	return b.Bytes(), nil
}

func gobDecode(data []byte, v any) error {
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(v); err != nil {
		return fmt.Errorf("saver: decode %T: %w", v, err)
	}
	return nil
}

type localWire struct {
	Plan planner.LocalPlan
	Err  *coordinator.RemoteError
}

// GobEncode implements gob.GobEncoder.
func (o localOutcome) GobEncode() ([]byte, error) {
	return gobEncode(localWire{Plan: o.plan, Err: coordinator.ToRemote(o.err)})
}

// GobDecode implements gob.GobDecoder.
func (o *localOutcome) GobDecode(data []byte) error {
	var w localWire
	if err := gobDecode(data, &w); err != nil {
		return err
	}
	*o = localOutcome{plan: w.Plan, err: coordinator.FromRemote(w.Err)}
	return nil
}

type planWire struct {
	Plan *planner.GlobalPlan
	Err  *coordinator.RemoteError
}

// GobEncode implements gob.GobEncoder.
func (o planOutcome) GobEncode() ([]byte, error) {
	return gobEncode(planWire{Plan: o.plan, Err: coordinator.ToRemote(o.err)})
}

// GobDecode implements gob.GobDecoder.
func (o *planOutcome) GobDecode(data []byte) error {
	var w planWire
	if err := gobDecode(data, &w); err != nil {
		return err
	}
	*o = planOutcome{plan: w.Plan, err: coordinator.FromRemote(w.Err)}
	return nil
}

type rankWire struct {
	CRCs    map[[2]int]uint32
	Written int64
	Err     *coordinator.RemoteError
}

// GobEncode implements gob.GobEncoder.
func (o rankOutcome) GobEncode() ([]byte, error) {
	return gobEncode(rankWire{CRCs: o.crcs, Written: o.written, Err: coordinator.ToRemote(o.err)})
}

// GobDecode implements gob.GobDecoder.
func (o *rankOutcome) GobDecode(data []byte) error {
	var w rankWire
	if err := gobDecode(data, &w); err != nil {
		return err
	}
	*o = rankOutcome{crcs: w.CRCs, written: w.Written, err: coordinator.FromRemote(w.Err)}
	return nil
}

type commitWire struct {
	Metadata *metadata.Checkpoint
	Size     int
	Bytes    int64
	Err      *coordinator.RemoteError
}

// GobEncode implements gob.GobEncoder.
func (o commitOutcome) GobEncode() ([]byte, error) {
	return gobEncode(commitWire{Metadata: o.md, Size: o.size, Bytes: o.bytes, Err: coordinator.ToRemote(o.err)})
}

// GobDecode implements gob.GobDecoder.
func (o *commitOutcome) GobDecode(data []byte) error {
	var w commitWire
	if err := gobDecode(data, &w); err != nil {
		return err
	}
	*o = commitOutcome{md: w.Metadata, size: w.Size, bytes: w.Bytes, err: coordinator.FromRemote(w.Err)}
	return nil
}

type planOutcome struct {
	plan *planner.GlobalPlan
	err  error
}

type rankOutcome struct {
	crcs    map[[2]int]uint32 // (entry, chunk) -> CRC32C; chunk -1 for bytes
	written int64
	err     error
}

type commitOutcome struct {
	md    *metadata.Checkpoint
	size  int
	bytes int64
	err   error
}

// Save is one rank's part of a collective save: every rank of c calls it
// with its own statedict. All ranks return the same outcome.
func Save(ctx context.Context, st *backend.Store, c coordinator.Coordinator, sd *statedict.StateDict, opts Options) (*Result, error) {
	return save(ctx, st, c, sd, opts, nil, hooks{})
}

// save is the one save algorithm, synchronous (stg nil: objects are written
// straight from the caller's buffers) or staged (every object is copied
// into stg's pool first, within its budget). h.planned is called once the
// rank has the global plan (not on a failure before it); h.staged exactly
// once, when this rank no longer reads the caller's buffers: after its last
// object is staged, or when the save fails before that.
func save(ctx context.Context, st *backend.Store, c coordinator.Coordinator, sd *statedict.StateDict, opts Options, stg *staging, h hooks) (*Result, error) {
	start := time.Now()
	staged := sync.OnceFunc(func() { h.call(h.staged) })
	defer staged()
	opts.defaults()
	rank := c.Rank()
	local, data, err := localPlan(rank, sd, opts)
	if stg != nil && err == nil {
		// Objects of at most a writer's share of the budget, so each can
		// stay staged until its Put returns (a retry rewinds it).
		share := stg.pool.share(opts.Concurrency)
		switch caps := st.Capabilities(); {
		case caps.StreamedPutBytes > 0:
			// Objects the driver streams without a copy of its own (an S3
			// single PUT): the staged pages are the only copy.
			share = min(share, caps.StreamedPutBytes)
		case caps.Multipart:
			// An object store's SDK may hold a copy of a request body (a
			// part buffer, a chunk, a body kept for signing): objects stay
			// within one part, and each upload reserves its size again
			// from the budget (see writeRank), so half of it at most.
			share = min(share, stg.pool.budget/2)
			if caps.PartSize > 0 {
				share = min(share, caps.PartSize)
			}
		}
		if opts.MaxObjectBytes <= 0 || opts.MaxObjectBytes > share {
			opts.MaxObjectBytes = share
		}
		local, data = splitItems(local, data, share)
	}

	// 1. Gather the local plans (a failed rank still takes part, with its error).
	vals, gerr := c.AllGather(ctx, localOutcome{plan: local, err: err})
	if gerr != nil {
		return nil, fmt.Errorf("save %s: %w", st, gerr)
	}

	// 2. Rank 0 plans and shares the global plan.
	var out planOutcome
	if rank == 0 {
		out = globalPlan(ctx, st, vals, opts)
	}
	bv, berr := c.Broadcast(ctx, out)
	if berr != nil {
		return nil, fmt.Errorf("save %s: %w", st, berr)
	}
	out = bv.(planOutcome)
	if out.err != nil {
		return nil, out.err
	}
	h.call(h.planned)

	// 3. Every rank writes its objects.
	ro := writeRank(ctx, st, rank, out.plan, data, opts, stg, staged)
	staged()
	vals, gerr = c.AllGather(ctx, ro)
	if gerr != nil {
		return nil, fmt.Errorf("save %s: %w", st, gerr)
	}

	// 4. Rank 0 commits the metadata, last.
	var co commitOutcome
	if rank == 0 {
		opts.Params = paramSet(sd, opts)
		co = commit(ctx, st, out.plan, vals, opts)
	}
	// The outcome must reach every rank even if a rank's context ends now:
	// once rank 0 committed, reporting a failure would make a caller retry
	// into ErrCommitted. Bounded, so a dead rank 0 cannot hang the others.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	cv, cerr := c.Broadcast(bctx, co)
	if cerr != nil {
		return nil, fmt.Errorf("save %s: %w", st, cerr)
	}
	co = cv.(commitOutcome)
	if co.err != nil {
		return nil, co.err
	}
	return &Result{URL: st.String(), Metadata: co.md, BytesWritten: co.bytes, MetadataBytes: co.size, Duration: time.Since(start)}, nil
}

type localOutcome struct {
	plan planner.LocalPlan
	err  error
}

// localPlan lists what this rank offers, in key order, with the data slices
// indexed like the plan items.
func localPlan(rank int, sd *statedict.StateDict, opts Options) (planner.LocalPlan, [][]byte, error) {
	lp := planner.LocalPlan{Rank: rank}
	if err := sd.Check(); err != nil {
		return lp, nil, fmt.Errorf("rank %d statedict: %w", rank, err)
	}
	var data [][]byte
	optPrefix := opts.OptimizerPrefix + "."
	for _, k := range sd.Keys() {
		if opts.NoSaveOptimizer && strings.HasPrefix(k, optPrefix) {
			continue
		}
		if t, ok := sd.Tensors[k]; ok {
			lp.Items = append(lp.Items, planner.SaveItem{Key: k, Kind: planner.TensorItem, DType: string(t.DType),
				GlobalShape: t.GlobalShape, Offsets: t.Offsets, Sizes: t.Sizes, Length: int64(len(t.Data))})
			data = append(data, t.Data)
			continue
		}
		b := sd.Bytes[k]
		lp.Items = append(lp.Items, planner.SaveItem{Key: k, Kind: planner.BytesItem, Length: int64(len(b))})
		data = append(data, b)
	}
	return lp, data, nil
}

func globalPlan(ctx context.Context, st *backend.Store, vals []any, opts Options) planOutcome {
	plans := make([]planner.LocalPlan, len(vals))
	var errs []error
	for r, v := range vals {
		lo := v.(localOutcome)
		if lo.err != nil {
			errs = append(errs, lo.err)
		}
		plans[r] = lo.plan
	}
	if len(errs) > 0 {
		return planOutcome{err: fmt.Errorf("save %s: %w", st, errors.Join(errs...))}
	}
	// Plan first: a save that cannot be planned must not uncommit the
	// checkpoint it was going to replace.
	// Every attempt names its data objects with an id of its own, so a
	// concurrent or retried writer never overwrites this attempt's data;
	// the metadata commit decides which attempt the checkpoint is.
	attempt, err := newAttemptID()
	if err != nil {
		return planOutcome{err: fmt.Errorf("save %s: %w", st, err)}
	}
	gp, err := planner.PlanSave(plans, planner.SaveOptions{MaxObjectBytes: opts.MaxObjectBytes, ObjectName: planner.AttemptObjectName(attempt)})
	if err != nil {
		return planOutcome{err: fmt.Errorf("save %s: plan: %w", st, err)}
	}
	if err := checkUncommitted(ctx, st, opts); err != nil {
		return planOutcome{err: err}
	}
	return planOutcome{plan: gp}
}

// newAttemptID returns 64 random bits in hex: the attempt id of a save.
func newAttemptID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("attempt id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// checkUncommitted refuses to write over a committed checkpoint (of any
// known format) unless Overwrite, in which case its metadata goes first.
func checkUncommitted(ctx context.Context, st *backend.Store, opts Options) error {
	for _, f := range metadata.Formats() {
		ok, err := st.Exists(ctx, f.ObjectKey)
		if err != nil {
			return fmt.Errorf("save %s: %w", st, err)
		}
		if !ok {
			continue
		}
		if !opts.Overwrite {
			return fmt.Errorf("save %s: %w (%s); pass Overwrite to replace it", st, ErrCommitted, st.URL(f.ObjectKey))
		}
		if err := st.Delete(ctx, f.ObjectKey); err != nil {
			return fmt.Errorf("save %s: uncommit the old checkpoint: %w", st, err)
		}
	}
	return nil
}

// writeRank writes this rank's objects, at most opts.Concurrency at once.
// When staging, objects are staged one after the other in plan order
// (waiting for the budget as uploads drain it) and staged is called after
// the last one; each upload holds its staged pages until its Put returns,
// and starts once the gate opens.
func writeRank(ctx context.Context, st *backend.Store, rank int, gp *planner.GlobalPlan, data [][]byte, opts Options, stg *staging, staged func()) rankOutcome {
	ro := rankOutcome{crcs: map[[2]int]uint32{}}
	var mine []planner.RankWrites
	for _, w := range gp.Writes {
		if w.Rank == rank {
			mine = append(mine, w)
		}
	}
	results := make([][]uint32, len(mine))
	var written atomic.Int64
	// The whole-object CRC costs a second pass over the bytes; only
	// backends that verify it server-side get one.
	objectCRC := st.Capabilities().ServerCRC32C
	// Whether the upload of an object of size bytes may be copied once more
	// by the driver or its SDK (see save).
	caps := st.Capabilities()
	sdkCopy := func(size int64) bool {
		return caps.Multipart && (caps.StreamedPutBytes == 0 || size > caps.StreamedPutBytes)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(cctx)
	uploads := semaphore.NewWeighted(int64(opts.Concurrency))
	var stageErr error
	for i, w := range mine {
		parts, err := objectParts(st, w, data)
		if err != nil {
			stageErr = err
			break
		}
		body, release := parts, func() {}
		if stg != nil {
			var reserve int64
			if sdkCopy(w.Size) {
				reserve = w.Size
			}
			if body, release, err = stg.pool.stage(gctx, w.Size, reserve, parts, stg.gate); err != nil {
				stageErr = fmt.Errorf("save rank %d: stage %s: %w", rank, st.URL(w.Object), err)
				break
			}
		}
		g.Go(func() error {
			defer release()
			if stg != nil {
				// Uploads compete with staging for the processors: they wait
				// until the save is staged, or staging waits for budget.
				if err := stg.gate.wait(gctx); err != nil {
					return fmt.Errorf("save rank %d: %s: %w", rank, st.URL(w.Object), err)
				}
			}
			if err := uploads.Acquire(gctx, 1); err != nil {
				return fmt.Errorf("save rank %d: %s: %w", rank, st.URL(w.Object), err)
			}
			defer uploads.Release(1)
			// CRCs of the bytes written (the staged copy when staging), here
			// rather than while staging, which blocks the caller.
			po := backend.PutOptions{ContentType: "application/octet-stream"}
			src := backend.NewSlicesReader(body)
			var tap *itemCRCTap
			if objectCRC {
				// Needed before the upload starts: a pass of its own.
				crcs, err := itemCRCs(gctx, body, w.Items)
				if err != nil {
					return fmt.Errorf("save rank %d: %s: checksums: %w", rank, st.URL(w.Object), err)
				}
				results[i] = crcs
				var obj uint32
				for _, b := range body {
					if obj, err = crc32c.UpdateContext(gctx, obj, b); err != nil {
						return fmt.Errorf("save rank %d: %s: checksum: %w", rank, st.URL(w.Object), err)
					}
				}
				po.CRC32C = &obj
			} else {
				// Computed while the upload copies the bytes, in
				// cache-sized pieces: one pass over them.
				tap = newItemCRCTap(w.Items)
				src.Tap(tap)
			}
			if err := st.Put(gctx, w.Object, w.Size, src, po); err != nil {
				return fmt.Errorf("save rank %d: %w", rank, err)
			}
			if !objectCRC {
				crcs, ok := tap.CRCs()
				if !ok { // not every byte went through this reader
					var err error
					if crcs, err = itemCRCs(gctx, body, w.Items); err != nil {
						return fmt.Errorf("save rank %d: %s: checksums: %w", rank, st.URL(w.Object), err)
					}
				}
				results[i] = crcs
			}
			written.Add(w.Size)
			return nil
		})
	}
	if stg != nil {
		// Uploads now read only staged pages: the caller may reuse its buffers.
		clear(data)
		staged()
	}
	if stageErr != nil {
		cancel()
	}
	err := g.Wait()
	switch {
	case stageErr == nil:
	case err == nil, ctx.Err() == nil && !errors.Is(stageErr, context.Canceled):
		// A staging failure of its own: the uploads it cancelled only echo it.
		err = stageErr
	}
	if err != nil {
		ro.err = err
		return ro
	}
	for i, w := range mine {
		for j, it := range w.Items {
			ro.crcs[[2]int{it.Entry, it.Chunk}] = results[i][j]
		}
	}
	ro.written = written.Load()
	return ro
}

// objectParts returns the byte slices of object w's items in order.
func objectParts(st *backend.Store, w planner.RankWrites, data [][]byte) ([][]byte, error) {
	parts := make([][]byte, len(w.Items))
	var off int64
	for j, it := range w.Items {
		if it.Offset != off {
			return nil, fmt.Errorf("save %s: plan places %q at %d, expected %d", st.URL(w.Object), it.Key, it.Offset, off)
		}
		parts[j] = data[it.LocalIndex]
		off += int64(len(parts[j]))
	}
	if off != w.Size {
		return nil, fmt.Errorf("save %s: plan size %d, items hold %d bytes", st.URL(w.Object), w.Size, off)
	}
	return parts, nil
}

// itemCRCs returns the CRC32C of each item of an object whose bytes are
// body's slices back to back (the items' slices, or staging pages); it
// stops with ctx's error once ctx is done.
func itemCRCs(ctx context.Context, body [][]byte, items []planner.WriteItem) ([]uint32, error) {
	crcs := make([]uint32, len(items))
	var cur []byte
	for j, it := range items {
		var crc uint32
		for n := it.Length; n > 0; {
			for len(cur) == 0 {
				cur, body = body[0], body[1:]
			}
			c := min(n, int64(len(cur)))
			var err error
			if crc, err = crc32c.UpdateContext(ctx, crc, cur[:c]); err != nil {
				return nil, err
			}
			cur, n = cur[c:], n-c
		}
		crcs[j] = crc
	}
	return crcs, nil
}

func commit(ctx context.Context, st *backend.Store, gp *planner.GlobalPlan, vals []any, opts Options) commitOutcome {
	var errs []error
	var total int64
	md := gp.Metadata
	for _, v := range vals {
		ro := v.(rankOutcome)
		if ro.err != nil {
			errs = append(errs, ro.err)
			continue
		}
		total += ro.written
		for k, crc := range ro.crcs {
			if k[1] < 0 {
				md.Bytes[k[0]].CRC32C = crc
			} else {
				md.Tensors[k[0]].Chunks[k[1]].CRC32C = crc
			}
		}
	}
	if len(errs) > 0 {
		return commitOutcome{err: fmt.Errorf("save %s: data not written, checkpoint not committed: %w", st, errors.Join(errs...))}
	}
	if err := ctx.Err(); err != nil {
		return commitOutcome{err: fmt.Errorf("save %s: not committed: %w", st, err)}
	}
	md.Writer = Version
	md.CreatedAt = time.Now().UTC().Truncate(time.Millisecond)
	md.Training = trainingRecord(md, opts)
	enc, err := metadata.Encode(md)
	if err != nil {
		return commitOutcome{err: fmt.Errorf("save %s: %w", st, err)}
	}
	po := backend.PutOptions{ContentType: "application/json"}
	crc := crc32c.Checksum(enc)
	po.CRC32C = &crc
	if st.Capabilities().CreateIfAbsent {
		po.IfNotExists = true
	}
	if err := st.PutBytes(ctx, metadata.ObjectKey, enc, po); err != nil {
		if errors.Is(err, backend.ErrAlreadyExists) {
			return commitOutcome{err: fmt.Errorf("save %s: another writer committed first: %w: %w", st, ErrCommitted, err)}
		}
		return commitOutcome{err: fmt.Errorf("save %s: commit metadata: %w", st, err)}
	}
	return commitOutcome{md: md, size: len(enc), bytes: total}
}

// paramSet returns the sorted, distinct parameter fqns to record:
// opts.Params, or else the JSON string lists of sd's param-group params
// values, or nil when any of those is not a list of strings.
func paramSet(sd *statedict.StateDict, opts Options) []string {
	params := slices.Clone(opts.Params)
	if params == nil {
		for k, v := range sd.Bytes {
			if !statedict.IsParamsKey(k, opts.OptimizerPrefix) {
				continue
			}
			var group []string
			if err := json.Unmarshal(v, &group); err != nil {
				return nil // not fqns (parameter indices, say): unknown
			}
			params = append(params, group...)
		}
	}
	slices.Sort(params)
	return slices.Compact(params)
}

// trainingRecord derives the training-state record from what was saved.
func trainingRecord(md *metadata.Checkpoint, opts Options) metadata.TrainingState {
	ts := metadata.TrainingState{
		Iteration:       opts.Iteration,
		OptimizerPrefix: opts.OptimizerPrefix,
		OptimizerSlots:  append([]string(nil), opts.OptimizerSlots...),
		ModelPrefix:     opts.ModelPrefix,
		Params:          opts.Params,
	}
	optAny, statePrefix := opts.OptimizerPrefix+".", statedict.StatePrefix(opts.OptimizerPrefix)
	var anyOpt bool
	count := func(k string) {
		if strings.HasPrefix(k, optAny) {
			anyOpt = true
		}
		if strings.HasPrefix(k, statePrefix) {
			ts.OptimizerStateEntries++
		}
		if strings.HasPrefix(k, opts.SchedulerPrefix+".") {
			ts.SchedulerPrefix = opts.SchedulerPrefix
		}
	}
	for _, t := range md.Tensors {
		count(t.Key)
	}
	for _, b := range md.Bytes {
		count(b.Key)
	}
	switch {
	case opts.NoSaveOptimizer:
		ts.Optimizer = metadata.OptimizerOmitted
	case anyOpt:
		ts.Optimizer = metadata.OptimizerSaved
	default:
		ts.Optimizer = metadata.OptimizerNone
	}
	if ts.Optimizer == metadata.OptimizerSaved && len(ts.Params) > 0 {
		ts.SetCensus(slotCensus(md, ts))
	}
	return ts
}

// slotCensus returns the slot names saved for each parameter of ts.Params:
// what a reader without the optimizer judges each parameter's state by
// (training.slot_sets, docs/FORMAT.md).
func slotCensus(md *metadata.Checkpoint, ts metadata.TrainingState) map[string][]string {
	keys := statedict.NewStateKeys(ts.OptimizerPrefix, ts.Params...)
	slots := map[string][]string{}
	note := func(k string) {
		if fqn, slot, ok := keys.Split(k); ok {
			slots[fqn] = append(slots[fqn], slot)
		}
	}
	for _, t := range md.Tensors {
		note(t.Key)
	}
	for _, b := range md.Bytes {
		note(b.Key)
	}
	return slots
}

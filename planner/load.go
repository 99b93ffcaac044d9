package planner

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// DefaultMaxReadBytes is the coalesced read cap when LoadOptions.MaxReadBytes
// is 0.
const DefaultMaxReadBytes = 64 << 20

// chunkIndex finds a tensor's chunks that intersect a box: non-empty chunks
// sorted by their start on the dimension with the most distinct starts, or,
// for a few chunks, all of them, scanned in order.
type chunkIndex struct {
	dim    int // -1 for 0-dim tensors and for a scan of a few chunks
	order  []int32
	starts []int64
	maxLen int64
}

// newChunkIndex indexes t's chunks; its slices come from the slabs.
func newChunkIndex(t *metadata.TensorEntry, ids *slab[int32], starts *slab[int64]) chunkIndex {
	D := len(t.Shape)
	var small [smallChunks]int32
	live := small[:0]
	for j := range t.Chunks {
		c := &t.Chunks[j]
		if len(c.Offsets) == D && len(c.Sizes) == D && statedict.NumElements(c.Sizes) > 0 {
			live = append(live, int32(j))
		}
	}
	ix := chunkIndex{dim: -1, order: ids.clone(live)}
	if D == 0 || len(ix.order) <= smallChunks {
		return ix
	}
	ix.dim, _ = bestDims(distinctStarts(t.Chunks, ix.order, D))
	d := ix.dim
	slices.SortFunc(ix.order, func(a, b int32) int {
		if c := cmp.Compare(t.Chunks[a].Offsets[d], t.Chunks[b].Offsets[d]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	ix.starts = starts.take(len(ix.order))
	for i, j := range ix.order {
		ix.starts[i] = t.Chunks[j].Offsets[d]
		ix.maxLen = max(ix.maxLen, t.Chunks[j].Sizes[d])
	}
	return ix
}

// visit calls fn for each chunk intersecting the box, with the
// intersection in global coordinates in lo and n (scratch space of at least
// len(offs) elements, reused between calls).
func (ix *chunkIndex) visit(t *metadata.TensorEntry, offs, sizes, lo, n []int64, fn func(chunk int32)) {
	from, to, i := int64(0), int64(0), 0
	if ix.dim >= 0 {
		d := ix.dim
		from, to = offs[d]-ix.maxLen, offs[d]+sizes[d]
		i = sort.Search(len(ix.starts), func(i int) bool { return ix.starts[i] > from })
	}
next:
	for ; i < len(ix.order) && (ix.dim < 0 || ix.starts[i] < to); i++ {
		c := &t.Chunks[ix.order[i]]
		for k := range offs {
			a := max(c.Offsets[k], offs[k])
			b := min(c.Offsets[k]+c.Sizes[k], offs[k]+sizes[k])
			if a >= b {
				continue next
			}
			lo[k], n[k] = a, b-a
		}
		fn(ix.order[i])
	}
}

// needed is one saved chunk (or bytes entry, chunk -1) some request needs.
type needed struct {
	entry, chunk int32
	copies       int32 // how many copies it feeds
	object       string
	offset       int64
	length       int64
}

// pendingCopy is a Copy waiting to be attached to its needed chunk.
type pendingCopy struct {
	need int32
	copy Copy
}

// PlanLoad plans the reads that fill reqs from the checkpoint md.
//
// Each tensor request is intersected with the saved chunks of its key
// (per-dimension interval intersection over a per-key index, so large
// row- or column-sharded tensors are not scanned per request); each
// intersection becomes a Copy on that chunk's ChunkRead. A saved chunk
// appears in one ChunkRead however many requests need it. A bytes request
// maps to its bytes entry (Chunk -1, a Copy with empty geometry).
//
// Needed chunks are grouped by object, sorted by offset and coalesced into
// ReadOps: the next chunk joins the current op when the hole before it is
// at most MaxGapBytes and the op stays within MaxReadBytes (a single larger
// chunk is an op of its own). Ops are sorted by object, then offset.
//
// md must be in canonical order (sorted entries, as Decode returns it);
// chunks whose rank does not match their tensor's are ignored (Validate
// rejects them).
//
// Errors name the key: ErrKeyNotFound for a key md lacks; ErrPlanMismatch for a
// kind or dtype mismatch or a box outside the saved shape; ErrInvalidPlan
// for a malformed request. Coverage is not checked here (see CheckCoverage).
func PlanLoad(md *metadata.Checkpoint, reqs []ReadRequest, opts LoadOptions) (*LoadPlan, error) {
	lp, err := newLoadPlanning(md, reqs, opts)
	if err != nil {
		return nil, err
	}
	for ri := range reqs {
		if err := lp.request(ri); err != nil {
			return nil, err
		}
	}
	order := lp.orderByObject()
	lp.coalesce(order, lp.copiesByNeed())
	for _, op := range lp.plan.Ops {
		lp.plan.BytesRead += op.Length
	}
	return lp.plan, nil
}

// entryState is what PlanLoad knows of one requested tensor: its chunk
// index and which of its chunks are needed.
type entryState struct {
	ix  chunkIndex
	pos []int32 // chunk -> index in need, -1 if not needed yet; nil until the tensor is requested
}

// loadPlanning is one PlanLoad call: the requests resolved into the chunks
// they need (request), ordered by object and offset (orderByObject), their
// copies attached (copiesByNeed) and coalesced into reads (coalesce).
type loadPlanning struct {
	md      *metadata.Checkpoint
	reqs    []ReadRequest
	opts    LoadOptions
	maxRead int64
	plan    *LoadPlan

	// Per requested tensor: a slice over all tensors when most are
	// requested (a map per tensor cost more than the rest of planning),
	// a map when a few are (a deep verify plans in batches: a slice of
	// every tensor per batch would cost the whole metadata each time).
	dense        []entryState
	sparse       map[int]int
	sparseStates blockList[entryState]

	ids      slab[int32]
	starts   slab[int64]
	geom     slab[int64]
	bytesPos map[int]int32
	need     blockList[needed]
	pending  blockList[pendingCopy]
	scratch  []int64
}

// newLoadPlanning checks the options.
func newLoadPlanning(md *metadata.Checkpoint, reqs []ReadRequest, opts LoadOptions) (*loadPlanning, error) {
	if md == nil {
		return nil, fmt.Errorf("%w: nil metadata", ErrInvalidPlan)
	}
	if opts.MaxGapBytes < 0 {
		return nil, fmt.Errorf("%w: MaxGapBytes %d is negative", ErrInvalidPlan, opts.MaxGapBytes)
	}
	lp := &loadPlanning{md: md, reqs: reqs, opts: opts, maxRead: opts.MaxReadBytes, plan: &LoadPlan{}, bytesPos: make(map[int]int32)}
	if lp.maxRead <= 0 {
		lp.maxRead = DefaultMaxReadBytes
	}
	if len(reqs) >= len(md.Tensors)/8 {
		lp.dense = make([]entryState, len(md.Tensors))
	} else {
		lp.sparse = make(map[int]int, len(reqs))
	}
	return lp, nil
}

func (lp *loadPlanning) stateOf(ti int) *entryState {
	if lp.dense != nil {
		return &lp.dense[ti]
	}
	k, ok := lp.sparse[ti]
	if !ok {
		k = lp.sparseStates.push(entryState{})
		lp.sparse[ti] = k
	}
	return lp.sparseStates.at(k)
}

// addCopy records that c needs the chunk (or bytes value) at object,
// offset, length: a new needed chunk the first time (*pos < 0).
func (lp *loadPlanning) addCopy(pos *int32, entry, chunk int, object string, offset, length int64, c Copy) {
	if *pos < 0 {
		*pos = int32(lp.need.push(needed{entry: int32(entry), chunk: int32(chunk), object: object, offset: offset, length: length}))
	}
	lp.need.at(int(*pos)).copies++
	lp.pending.push(pendingCopy{need: *pos, copy: c})
}

// request resolves request ri: its bytes value, or the saved chunks its
// region intersects, each with the copy into the request.
func (lp *loadPlanning) request(ri int) error {
	md, r := lp.md, &lp.reqs[ri]
	ti := sort.Search(len(md.Tensors), func(i int) bool { return md.Tensors[i].Key >= r.Key })
	bi := sort.Search(len(md.Bytes), func(i int) bool { return md.Bytes[i].Key >= r.Key })
	var te *metadata.TensorEntry
	var be *metadata.BytesEntry
	if ti < len(md.Tensors) && md.Tensors[ti].Key == r.Key {
		te = &md.Tensors[ti]
	}
	if bi < len(md.Bytes) && md.Bytes[bi].Key == r.Key {
		be = &md.Bytes[bi]
	}
	switch r.Kind {
	case BytesItem:
		if be == nil {
			if te != nil {
				return fmt.Errorf("%w: key %q: requested as bytes, checkpoint holds a %s tensor %v", ErrPlanMismatch, r.Key, te.DType, te.Shape)
			}
			return fmt.Errorf("%w: bytes %q", ErrKeyNotFound, r.Key)
		}
		pos, ok := lp.bytesPos[bi]
		if !ok {
			pos = -1
		}
		lp.addCopy(&pos, bi, -1, be.Object, be.Offset, be.Length, Copy{Request: ri})
		lp.bytesPos[bi] = pos
		lp.plan.BytesNeeded += be.Length
	case TensorItem:
		if te == nil {
			if be != nil {
				return fmt.Errorf("%w: key %q: requested as a %s tensor, checkpoint holds bytes", ErrPlanMismatch, r.Key, r.DType)
			}
			return fmt.Errorf("%w: tensor %q", ErrKeyNotFound, r.Key)
		}
		if err := checkRequest(r, te); err != nil {
			return err
		}
		lp.plan.BytesNeeded += statedict.NumElements(r.Sizes) * metadata.ElementSize(te.DType)
		if statedict.NumElements(r.Sizes) == 0 {
			return nil
		}
		st := lp.stateOf(ti)
		if st.pos == nil {
			st.ix = newChunkIndex(te, &lp.ids, &lp.starts)
			st.pos = lp.ids.take(len(te.Chunks))
			for j := range st.pos {
				st.pos[j] = -1
			}
		}
		D := len(te.Shape)
		if cap(lp.scratch) < 2*D {
			lp.scratch = make([]int64, 2*D)
		}
		lo, n := lp.scratch[:D], lp.scratch[D:2*D]
		st.ix.visit(te, r.Offsets, r.Sizes, lo, n, func(j int32) {
			c := &te.Chunks[j]
			lp.addCopy(&st.pos[j], ti, int(j), c.Object, c.Offset, c.Length, Copy{Request: ri, Offsets: lp.geom.clone(lo), Sizes: lp.geom.clone(n)})
		})
	default:
		return fmt.Errorf("%w: request %d for %q has unknown kind %d", ErrInvalidPlan, ri, r.Key, r.Kind)
	}
	return nil
}

// needKey orders the needed chunks: by object, then offset.
type needKey struct {
	obj    int32
	idx    int32
	offset int64
}

// orderByObject sorts the needed chunks by object name through integer
// ids (names compared once per distinct object, not per comparison): a
// counting sort by object (stable), then by offset within each object;
// the usual layout is already in offset order, which costs one pass.
func (lp *loadPlanning) orderByObject() []needKey {
	objID := make(map[string]int32)
	var names []string
	lp.need.each(func(_ int, n *needed) {
		if _, ok := objID[n.object]; !ok {
			objID[n.object] = 0
			names = append(names, n.object)
		}
	})
	slices.Sort(names)
	for i, nm := range names {
		objID[nm] = int32(i)
	}
	objStart := make([]int, len(names)+1)
	lp.need.each(func(_ int, n *needed) { objStart[objID[n.object]+1]++ })
	for i := range names {
		objStart[i+1] += objStart[i]
	}
	order := make([]needKey, lp.need.n)
	fillAt := slices.Clone(objStart[:len(names)])
	lp.need.each(func(i int, n *needed) {
		o := objID[n.object]
		order[fillAt[o]] = needKey{obj: o, idx: int32(i), offset: n.offset}
		fillAt[o]++
	})
	byOffset := func(a, b needKey) int {
		if c := cmp.Compare(a.offset, b.offset); c != 0 {
			return c
		}
		return cmp.Compare(a.idx, b.idx)
	}
	for o := range names {
		if bucket := order[objStart[o]:objStart[o+1]]; !slices.IsSortedFunc(bucket, byOffset) {
			slices.SortFunc(bucket, byOffset)
		}
	}
	return order
}

// copiesOf holds every needed chunk's copies (in request order) in one
// allocation: chunk i's are flat[start[i]:start[i+1]].
type copiesOf struct {
	flat  []Copy
	start []int32
}

func (c copiesOf) of(i int32) []Copy { return c.flat[c.start[i]:c.start[i+1]:c.start[i+1]] }

// copiesByNeed attaches the copies to their needed chunks.
func (lp *loadPlanning) copiesByNeed() copiesOf {
	copyStart := make([]int32, lp.need.n+1)
	lp.need.each(func(i int, n *needed) { copyStart[i+1] = copyStart[i] + n.copies })
	flat := make([]Copy, lp.pending.n)
	fill := slices.Clone(copyStart[:lp.need.n])
	lp.pending.each(func(_ int, p *pendingCopy) {
		flat[fill[p.need]] = p.copy
		fill[p.need]++
	})
	return copiesOf{flat: flat, start: copyStart}
}

// coalesce merges the ordered chunks into reads (gaps up to MaxGapBytes,
// reads up to MaxReadBytes) and gives every op its exact slice of one
// ChunkRead array.
func (lp *loadPlanning) coalesce(order []needKey, copies copiesOf) {
	plan, md := lp.plan, lp.md
	reads := make([]ChunkRead, len(order))
	var opStarts []int
	var cur *ReadOp
	curObj := int32(-1)
	for i, k := range order {
		n := lp.need.at(int(k.idx))
		end := n.offset + n.length
		if cur != nil && curObj == k.obj && n.offset-(cur.Offset+cur.Length) <= lp.opts.MaxGapBytes &&
			max(end, cur.Offset+cur.Length)-cur.Offset <= lp.maxRead {
			cur.Length = max(end, cur.Offset+cur.Length) - cur.Offset
		} else {
			opStarts = append(opStarts, i)
			curObj = k.obj
			plan.Ops = append(plan.Ops, ReadOp{Object: n.object, Offset: n.offset, Length: n.length})
			cur = &plan.Ops[len(plan.Ops)-1]
		}
		key := ""
		if n.chunk < 0 {
			key = md.Bytes[n.entry].Key
		} else {
			key = md.Tensors[n.entry].Key
		}
		reads[i] = ChunkRead{Key: key, Entry: int(n.entry), Chunk: int(n.chunk), Start: n.offset - cur.Offset, Length: n.length,
			Copies: copies.of(k.idx)}
	}
	opStarts = append(opStarts, len(reads))
	for o := range plan.Ops {
		plan.Ops[o].Chunks = reads[opStarts[o]:opStarts[o+1]:opStarts[o+1]]
	}
}

// checkRequest checks a tensor request against the saved entry.
func checkRequest(r *ReadRequest, te *metadata.TensorEntry) error {
	if r.DType != te.DType {
		return fmt.Errorf("%w: tensor %q: requested dtype %s, checkpoint has %s", ErrPlanMismatch, r.Key, r.DType, te.DType)
	}
	D := len(te.Shape)
	if len(r.Offsets) != D || len(r.Sizes) != D {
		return fmt.Errorf("%w: tensor %q: requested box offsets %v sizes %v does not match the checkpoint's shape %v", ErrPlanMismatch, r.Key, r.Offsets, r.Sizes, te.Shape)
	}
	for d := range D {
		if o, s := r.Offsets[d], r.Sizes[d]; o < 0 || s < 0 || o > te.Shape[d]-s {
			return fmt.Errorf("%w: tensor %q: requested box offsets %v sizes %v is outside the checkpoint's shape %v", ErrPlanMismatch, r.Key, r.Offsets, r.Sizes, te.Shape)
		}
	}
	return nil
}

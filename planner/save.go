package planner

import (
	"cmp"
	"container/heap"
	"fmt"
	"slices"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// DefaultObjectName names a rank's n-th data object:
// "rank-RRRRR-NNN.data". Savers use AttemptObjectName instead, so that two
// attempts at one checkpoint never write the same object.
func DefaultObjectName(rank, n int) string { return fmt.Sprintf("rank-%05d-%03d.data", rank, n) }

// AttemptObjectName returns the namer of one save attempt's data objects:
// "rank-RRRRR-NNN.<attempt>.data". attempt must be non-empty lowercase hex
// or decimal digits (ParseObjectName accepts [0-9a-f]+).
func AttemptObjectName(attempt string) func(rank, n int) string {
	return func(rank, n int) string { return fmt.Sprintf("rank-%05d-%03d.%s.data", rank, n, attempt) }
}

// ParseObjectName reports whether name is a data object name ckptkit
// writes, "rank-R-N.data" (DefaultObjectName) or "rank-R-N.A.data"
// (AttemptObjectName), with R and N decimal digits of any width and A
// lowercase hex; attempt is "" for the first form.
func ParseObjectName(name string) (attempt string, ok bool) {
	rest, ok := strings.CutPrefix(name, "rank-")
	if !ok {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, ".data")
	if !ok {
		return "", false
	}
	rest, attempt, dotted := strings.Cut(rest, ".")
	if dotted && !isLowerHex(attempt) {
		return "", false
	}
	a, b, ok := strings.Cut(rest, "-")
	return attempt, ok && isDigits(a) && isDigits(b)
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func isLowerHex(s string) bool {
	return s != "" && strings.Trim(s, "0123456789abcdef") == ""
}

// itemRef locates a SaveItem: plans[plan].Items[item].
type itemRef struct{ plan, item int32 }

// keyGroup is every item offered under one key.
type keyGroup struct {
	key   string
	first itemRef // the first offer, the reference for agreement checks
	start int32   // where refs start in the merged order
	refs  []itemRef
}

// unit is one distinct thing to write: a tensor chunk or a bytes value,
// with the ranks that offer it (refs, sorted by rank) and the chosen writer.
type unit struct {
	entry, chunk int32 // chunk -1 for bytes
	length       int64
	refs         []itemRef
	writer       itemRef
}

// PlanSave merges the ranks' local plans into the global plan.
//
//   - Items offered under the same key with the same box by several ranks
//     (and bytes items under the same key) are replicated and written once.
//     Units offered by a single rank are assigned first; replicated ones
//     follow, largest first (ties by key, then box), each to the offering
//     rank with the fewest bytes assigned so far (ties: lowest rank).
//   - Every rank offering a key must agree on kind, dtype and global shape
//     (bytes: on length); otherwise ErrPlanMismatch names the key and both ranks.
//   - Tensor chunks must be in bounds and tile the global shape exactly
//     (CheckCoverage); chunks with zero elements are dropped. A 0-dim
//     tensor has one element.
//   - Each rank packs its units back to back, ordered by key then chunk
//     offsets, into objects named by opts.ObjectName (DefaultObjectName),
//     starting a new object when MaxObjectBytes would be exceeded. Ranks
//     that write nothing get no object.
//
// The returned metadata has entries and objects sorted, CRC32C fields zero,
// and Training.Optimizer metadata.OptimizerNone; WriteItem.Entry/Chunk
// index its final slices. WriteItems share the caller's slices.
// Cost: O(n log n) in the number of items.
func PlanSave(plans []LocalPlan, opts SaveOptions) (*GlobalPlan, error) {
	sp, err := newSavePlanning(plans, opts)
	if err != nil {
		return nil, err
	}
	if err := sp.groupByKey(); err != nil {
		return nil, err
	}
	sp.newMetadata()
	if err := sp.tensorUnits(); err != nil {
		return nil, err
	}
	if err := sp.bytesUnits(); err != nil {
		return nil, err
	}
	sp.balance()
	writes, err := sp.pack(sp.perRank())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(writes, func(a, b RankWrites) int { return strings.Compare(a.Object, b.Object) })
	sp.md.Objects = make([]metadata.ObjectEntry, len(writes))
	for i, w := range writes {
		sp.md.Objects[i] = metadata.ObjectEntry{Key: w.Object, Size: w.Size}
	}
	return &GlobalPlan{Writes: writes, Metadata: sp.md}, nil
}

// savePlanning is one PlanSave call: the plans, what each phase derives
// from them, and the metadata being built. Each phase is a method, in the
// order PlanSave calls them.
type savePlanning struct {
	plans []LocalPlan
	opts  SaveOptions
	name  func(rank, n int) string
	total int // items in all plans

	flat   []itemRef  // every item, grouped by key (groupByKey)
	groups []keyGroup // one per key, in key order
	// tensorGroups and bytesGroups index groups by kind, in key order.
	tensorGroups, bytesGroups []int32

	md           *metadata.Checkpoint
	units        []unit // tensor chunks first (nTensorUnits), then bytes
	nTensorUnits int
	// Shared backing arrays for all metadata geometry and chunks.
	geom      slab[int64]
	chunkSlab slab[metadata.Chunk]
}

// newSavePlanning checks the options and that every plan has its own
// non-negative rank.
func newSavePlanning(plans []LocalPlan, opts SaveOptions) (*savePlanning, error) {
	sp := &savePlanning{plans: plans, opts: opts, name: opts.ObjectName}
	if sp.name == nil {
		sp.name = DefaultObjectName
	}
	if opts.MaxObjectBytes < 0 {
		return nil, fmt.Errorf("%w: MaxObjectBytes %d is negative", ErrInvalidPlan, opts.MaxObjectBytes)
	}
	seenRank := make(map[int]int, len(plans))
	for i, p := range plans {
		if p.Rank < 0 {
			return nil, fmt.Errorf("%w: plan %d has negative rank %d", ErrInvalidPlan, i, p.Rank)
		}
		if j, dup := seenRank[p.Rank]; dup {
			return nil, fmt.Errorf("%w: plans %d and %d both claim rank %d", ErrInvalidPlan, j, i, p.Rank)
		}
		seenRank[p.Rank] = i
		sp.total += len(p.Items)
	}
	return sp, nil
}

func (sp *savePlanning) item(r itemRef) *SaveItem { return &sp.plans[r.plan].Items[r.item] }
func (sp *savePlanning) rank(r itemRef) int       { return sp.plans[r.plan].Rank }

// groupByKey validates items and groups them by key: a merge of the plans
// in key order (each plan sorted first if it is not already), so a group's
// offers are adjacent and the groups come out sorted, without a map of
// keys. The first offer of a group is the one of the lowest plan index.
func (sp *savePlanning) groupByKey() error {
	sp.flat = make([]itemRef, 0, sp.total)
	longest := 0
	for _, p := range sp.plans {
		longest = max(longest, len(p.Items))
	}
	// As many groups as the longest plan has items when every rank
	// offers the same keys (the usual case); more only grow.
	sp.groups = make([]keyGroup, 0, longest)
	var err error
	mergeByKey(sp.plans, func(r itemRef) bool {
		it := sp.item(r)
		if err = checkItem(it, sp.rank(r)); err != nil {
			return false
		}
		if n := len(sp.groups); n > 0 && sp.groups[n-1].key == it.Key {
			if err = agree(sp.item(sp.groups[n-1].first), sp.rank(sp.groups[n-1].first), it, sp.rank(r)); err != nil {
				return false
			}
		} else {
			sp.groups = append(sp.groups, keyGroup{key: it.Key, first: r, start: int32(len(sp.flat))})
		}
		sp.flat = append(sp.flat, r)
		return true
	})
	if err != nil {
		return err
	}
	for g := range sp.groups {
		end := int32(len(sp.flat))
		if g+1 < len(sp.groups) {
			end = sp.groups[g+1].start
		}
		sp.groups[g].refs = sp.flat[sp.groups[g].start:end:end]
		if sp.item(sp.groups[g].first).Kind == TensorItem {
			sp.tensorGroups = append(sp.tensorGroups, int32(g))
		} else {
			sp.bytesGroups = append(sp.bytesGroups, int32(g))
		}
	}
	return nil
}

// newMetadata starts the checkpoint's metadata: one entry per key.
func (sp *savePlanning) newMetadata() {
	sp.md = &metadata.Checkpoint{
		Format:    metadata.FormatName,
		Version:   metadata.VersionString(),
		WorldSize: len(sp.plans),
		Tensors:   make([]metadata.TensorEntry, len(sp.tensorGroups)),
		Bytes:     make([]metadata.BytesEntry, len(sp.bytesGroups)),
		Training:  metadata.TrainingState{Optimizer: metadata.OptimizerNone},
	}
	sp.units = make([]unit, 0, sp.total)
}

func (sp *savePlanning) sameGeom(a, b itemRef) bool {
	return slices.Equal(sp.item(a).Offsets, sp.item(b).Offsets) && slices.Equal(sp.item(a).Sizes, sp.item(b).Sizes)
}

func (sp *savePlanning) geomCmp(a, b itemRef) int {
	x, y := sp.item(a), sp.item(b)
	if c := slices.Compare(x.Offsets, y.Offsets); c != 0 {
		return c
	}
	if c := slices.Compare(x.Sizes, y.Sizes); c != 0 {
		return c
	}
	return cmp.Compare(sp.rank(a), sp.rank(b))
}

// tensorUnits fills the tensor entries: each distinct chunk once (empty
// chunks dropped), offered by one or more ranks (a unit), a rank offering
// one chunk twice refused, the chunks tiling the global shape exactly.
func (sp *savePlanning) tensorUnits() error {
	for e, g := range sp.tensorGroups {
		grp := &sp.groups[g]
		first := sp.item(grp.first)
		te := &sp.md.Tensors[e]
		te.Key, te.DType, te.Shape = grp.key, first.DType, sp.geom.clone(first.GlobalShape)
		refs := slices.DeleteFunc(grp.refs, func(r itemRef) bool {
			return statedict.NumElements(sp.item(r).Sizes) == 0
		})
		slices.SortFunc(refs, sp.geomCmp)
		distinct := 0
		for i := range refs {
			if i == 0 || !sp.sameGeom(refs[i-1], refs[i]) {
				distinct++
			}
		}
		te.Chunks = sp.chunkSlab.take(distinct)[:0]
		for i := 0; i < len(refs); {
			j := i + 1
			for j < len(refs) && sp.sameGeom(refs[i], refs[j]) {
				if sp.rank(refs[j]) == sp.rank(refs[j-1]) {
					return fmt.Errorf("%w: rank %d offers tensor %q chunk offsets %v sizes %v twice", ErrInvalidPlan, sp.rank(refs[j]), grp.key, sp.item(refs[j]).Offsets, sp.item(refs[j]).Sizes)
				}
				j++
			}
			it := sp.item(refs[i])
			te.Chunks = append(te.Chunks, metadata.Chunk{Offsets: sp.geom.clone(it.Offsets), Sizes: sp.geom.clone(it.Sizes), Length: it.Length})
			sp.units = append(sp.units, unit{entry: int32(e), chunk: int32(len(te.Chunks) - 1), length: it.Length, refs: refs[i:j]})
			i = j
		}
		if err := CheckCoverage(te); err != nil {
			return err
		}
	}
	sp.nTensorUnits = len(sp.units)
	return nil
}

// bytesUnits fills the bytes entries: one unit per key, a rank offering
// one key twice refused.
func (sp *savePlanning) bytesUnits() error {
	for e, g := range sp.bytesGroups {
		grp := &sp.groups[g]
		slices.SortFunc(grp.refs, func(a, b itemRef) int { return cmp.Compare(sp.rank(a), sp.rank(b)) })
		for i := 1; i < len(grp.refs); i++ {
			if sp.rank(grp.refs[i]) == sp.rank(grp.refs[i-1]) {
				return fmt.Errorf("%w: rank %d offers bytes %q twice", ErrInvalidPlan, sp.rank(grp.refs[i]), grp.key)
			}
		}
		sp.md.Bytes[e] = metadata.BytesEntry{Key: grp.key, Length: sp.item(grp.first).Length}
		sp.units = append(sp.units, unit{entry: int32(e), chunk: -1, length: sp.item(grp.first).Length, refs: grp.refs})
	}
	return nil
}

// unitKey is the key of u, from the metadata.
func (sp *savePlanning) unitKey(u *unit) string {
	if u.chunk < 0 {
		return sp.md.Bytes[u.entry].Key
	}
	return sp.md.Tensors[u.entry].Key
}

// balance picks each unit's writer: its only offerer, or for replicated
// units (largest first, then by key and chunk) the least loaded offerer
// by bytes.
func (sp *savePlanning) balance() {
	units := sp.units
	load := make([]int64, len(sp.plans))
	var replicated []int32
	for u := range units {
		if len(units[u].refs) == 1 {
			units[u].writer = units[u].refs[0]
			load[units[u].writer.plan] += units[u].length
		} else {
			replicated = append(replicated, int32(u))
		}
	}
	slices.SortFunc(replicated, func(a, b int32) int {
		ua, ub := &units[a], &units[b]
		if c := cmp.Compare(ub.length, ua.length); c != 0 {
			return c
		}
		if c := strings.Compare(sp.unitKey(ua), sp.unitKey(ub)); c != 0 {
			return c
		}
		return cmp.Compare(ua.chunk, ub.chunk)
	})
	for _, u := range replicated {
		best := units[u].refs[0]
		for _, r := range units[u].refs[1:] {
			if load[r.plan] < load[best.plan] {
				best = r
			}
		}
		units[u].writer = best
		load[best.plan] += units[u].length
	}
}

// perRank walks the units in global key order (tensors and bytes merged by
// key) and returns each plan's units, in that order.
func (sp *savePlanning) perRank() [][]int32 {
	units, md := sp.units, sp.md
	perPlan := make([][]int32, len(sp.plans))
	ti, bi := 0, sp.nTensorUnits
	for ti < sp.nTensorUnits || bi < len(units) {
		var u int
		if bi >= len(units) || (ti < sp.nTensorUnits && md.Tensors[units[ti].entry].Key < md.Bytes[units[bi].entry].Key) {
			u, ti = ti, ti+1
		} else {
			u, bi = bi, bi+1
		}
		w := units[u].writer.plan
		perPlan[w] = append(perPlan[w], int32(u))
	}
	return perPlan
}

// pack packs each rank's units back to back into objects, a new object
// when MaxObjectBytes would be exceeded, and records where each chunk and
// bytes value lands in the metadata.
func (sp *savePlanning) pack(perPlan [][]int32) ([]RankWrites, error) {
	var writes []RankWrites
	objSeen := make(map[string]int)
	for pi, us := range perPlan {
		if len(us) == 0 {
			continue
		}
		items := make([]WriteItem, len(us))
		r := sp.plans[pi].Rank
		n, start := 0, 0
		cur := RankWrites{Rank: r, Object: sp.name(r, 0)}
		flush := func(end int) error {
			if other, dup := objSeen[cur.Object]; dup {
				return fmt.Errorf("%w: object name %q used by ranks %d and %d", ErrInvalidPlan, cur.Object, other, r)
			}
			objSeen[cur.Object] = r
			cur.Items = items[start:end:end]
			writes = append(writes, cur)
			return nil
		}
		for i, u := range us {
			un := &sp.units[u]
			if sp.opts.MaxObjectBytes > 0 && i > start && cur.Size+un.length > sp.opts.MaxObjectBytes {
				if err := flush(i); err != nil {
					return nil, err
				}
				n++
				start = i
				cur = RankWrites{Rank: r, Object: sp.name(r, n)}
			}
			// The key from the metadata, which units walk in order, not
			// from the plans, which they visit out of order.
			items[i] = WriteItem{Key: sp.unitKey(un), Length: un.length, LocalIndex: int(un.writer.item),
				Object: cur.Object, Offset: cur.Size, Entry: int(un.entry), Chunk: int(un.chunk)}
			if un.chunk < 0 {
				b := &sp.md.Bytes[un.entry]
				b.Object, b.Offset = cur.Object, cur.Size
			} else {
				c := &sp.md.Tensors[un.entry].Chunks[un.chunk]
				c.Object, c.Offset = cur.Object, cur.Size
			}
			cur.Size += un.length
		}
		if err := flush(len(us)); err != nil {
			return nil, err
		}
	}
	return writes, nil
}

// checkItem validates one item on its own.
func checkItem(it *SaveItem, rank int) error {
	if it.Key == "" {
		return fmt.Errorf("%w: rank %d offers an item with an empty key", ErrInvalidPlan, rank)
	}
	switch it.Kind {
	case BytesItem:
		if it.Length < 0 {
			return fmt.Errorf("%w: rank %d bytes %q has negative length %d", ErrInvalidPlan, rank, it.Key, it.Length)
		}
		return nil
	case TensorItem:
	default:
		return fmt.Errorf("%w: rank %d item %q has unknown kind %d", ErrInvalidPlan, rank, it.Key, it.Kind)
	}
	es := metadata.ElementSize(it.DType)
	if es == 0 {
		return fmt.Errorf("%w: rank %d tensor %q has unknown dtype %q", ErrInvalidPlan, rank, it.Key, it.DType)
	}
	D := len(it.GlobalShape)
	if len(it.Offsets) != D || len(it.Sizes) != D {
		return fmt.Errorf("%w: rank %d tensor %q: offsets %v and sizes %v do not match global shape %v", ErrInvalidPlan, rank, it.Key, it.Offsets, it.Sizes, it.GlobalShape)
	}
	if statedict.NumElements(it.GlobalShape) < 0 {
		return fmt.Errorf("%w: rank %d tensor %q: invalid global shape %v", ErrInvalidPlan, rank, it.Key, it.GlobalShape)
	}
	for d := range D {
		if o, s := it.Offsets[d], it.Sizes[d]; o < 0 || s < 0 || o > it.GlobalShape[d]-s {
			return &CoverageError{Key: it.Key, Shape: slices.Clone(it.GlobalShape), Kind: CoverageOutOfBounds,
				Offsets: slices.Clone(it.Offsets), Sizes: slices.Clone(it.Sizes),
				Detail: fmt.Sprintf("rank %d's chunk exceeds dimension %d", rank, d)}
		}
	}
	if want := statedict.NumElements(it.Sizes) * es; it.Length != want {
		return fmt.Errorf("%w: rank %d tensor %q chunk sizes %v of %s: length %d, want %d", ErrInvalidPlan, rank, it.Key, it.Sizes, it.DType, it.Length, want)
	}
	return nil
}

// agree checks that two offers of one key agree on kind, dtype and global
// shape (bytes: length).
func agree(a *SaveItem, ra int, b *SaveItem, rb int) error {
	kind := func(k ItemKind) string {
		if k == TensorItem {
			return "a tensor"
		}
		return "bytes"
	}
	switch {
	case a.Kind != b.Kind:
		return fmt.Errorf("%w: key %q: rank %d offers %s, rank %d offers %s", ErrPlanMismatch, a.Key, ra, kind(a.Kind), rb, kind(b.Kind))
	case a.Kind == BytesItem && a.Length != b.Length:
		return fmt.Errorf("%w: bytes %q: rank %d offers %d bytes, rank %d offers %d", ErrPlanMismatch, a.Key, ra, a.Length, rb, b.Length)
	case a.Kind == TensorItem && a.DType != b.DType:
		return fmt.Errorf("%w: tensor %q: rank %d offers dtype %s, rank %d offers %s", ErrPlanMismatch, a.Key, ra, a.DType, rb, b.DType)
	case a.Kind == TensorItem && !slices.Equal(a.GlobalShape, b.GlobalShape):
		return fmt.Errorf("%w: tensor %q: rank %d offers global shape %v, rank %d offers %v", ErrPlanMismatch, a.Key, ra, a.GlobalShape, rb, b.GlobalShape)
	}
	return nil
}

// mergeByKey calls yield with every item of plans in key order (ties by
// plan index, then item index) until yield returns false: a k-way merge of
// the plans, each visited in key order (its own order when already sorted,
// the common case; otherwise a sorted index). It costs O(n log k) key
// comparisons for n items in k plans.
func mergeByKey(plans []LocalPlan, yield func(itemRef) bool) {
	h := &mergeHeap{plans: plans}
	var sorted *mergeCursor // the last plan that needed a sorted index
	for pi := range plans {
		items := plans[pi].Items
		if len(items) == 0 {
			continue
		}
		c := &mergeCursor{plan: int32(pi)}
		switch {
		case slices.IsSortedFunc(items, func(a, b SaveItem) int { return strings.Compare(a.Key, b.Key) }):
		case sorted != nil && sameKeys(plans[sorted.plan].Items, items):
			// Ranks usually offer the same keys in the same order: one
			// sort serves them all (the index is only read).
			c.order = sorted.order
		default:
			c.order = make([]int32, len(items))
			for i := range c.order {
				c.order[i] = int32(i)
			}
			slices.SortStableFunc(c.order, func(a, b int32) int { return strings.Compare(items[a].Key, items[b].Key) })
			sorted = c
		}
		h.cursors = append(h.cursors, c)
	}
	heap.Init(h)
	for h.Len() > 0 {
		c := h.cursors[0]
		if !yield(itemRef{c.plan, c.item()}) {
			return
		}
		if c.pos++; c.pos == len(plans[c.plan].Items) {
			heap.Pop(h)
		} else {
			heap.Fix(h, 0)
		}
	}
}

// sameKeys reports whether a and b offer the same keys in the same order.
func sameKeys(a, b []SaveItem) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key {
			return false
		}
	}
	return true
}

// mergeCursor is a plan's position in mergeByKey.
type mergeCursor struct {
	plan  int32
	order []int32 // nil: the plan's own order
	pos   int
}

func (c *mergeCursor) item() int32 {
	if c.order == nil {
		return int32(c.pos)
	}
	return c.order[c.pos]
}

// mergeHeap orders the cursors by their current key, then plan index
// (container/heap.Interface).
type mergeHeap struct {
	plans   []LocalPlan
	cursors []*mergeCursor
}

func (h *mergeHeap) Len() int { return len(h.cursors) }
func (h *mergeHeap) Less(i, j int) bool {
	a, b := h.cursors[i], h.cursors[j]
	if c := strings.Compare(h.plans[a.plan].Items[a.item()].Key, h.plans[b.plan].Items[b.item()].Key); c != 0 {
		return c < 0
	}
	return a.plan < b.plan
}
func (h *mergeHeap) Swap(i, j int) { h.cursors[i], h.cursors[j] = h.cursors[j], h.cursors[i] }
func (h *mergeHeap) Push(x any)    { h.cursors = append(h.cursors, x.(*mergeCursor)) }
func (h *mergeHeap) Pop() any {
	c := h.cursors[len(h.cursors)-1]
	h.cursors = h.cursors[:len(h.cursors)-1]
	return c
}

package planner

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// CheckCoverage checks that t.Chunks tile t.Shape exactly: every chunk in
// bounds, no element covered twice, none left uncovered. It returns nil or a
// *CoverageError (errors.Is(err, ErrCoverage)) naming the key and a concrete
// offending box.
//
// Rules: a 0-dim tensor needs exactly one chunk; a tensor with a zero-size
// dimension needs no chunk; chunks with zero elements are ignored.
//
// Cost: O(D·n log n) for n chunks of a D-dim tensor under row, column and
// grid shardings. Overlaps are found by a sweep along the dimension with
// the most distinct start offsets that compares a chunk only with the live
// chunks near it on a second dimension; with no overlap, a volume sum
// detects a gap, which a slab-by-slab descent then locates.
func CheckCoverage(t *metadata.TensorEntry) error {
	cerr := func(kind string, offs, sizes []int64, format string, a ...any) error {
		return &CoverageError{Key: t.Key, Shape: slices.Clone(t.Shape), Kind: kind,
			Offsets: slices.Clone(offs), Sizes: slices.Clone(sizes), Detail: fmt.Sprintf(format, a...)}
	}
	D := len(t.Shape)
	total := statedict.NumElements(t.Shape)
	if total < 0 {
		return cerr(CoverageOutOfBounds, make([]int64, D), t.Shape, "invalid shape (negative dimension or too many elements)")
	}
	var small [smallChunks]int32 // the usual few chunks need no allocation
	live := small[:0]
	for j := range t.Chunks {
		ch := &t.Chunks[j]
		if len(ch.Offsets) != D || len(ch.Sizes) != D {
			return cerr(CoverageOutOfBounds, ch.Offsets, ch.Sizes, "chunk %d has %d offsets and %d sizes for a %d-dim tensor", j, len(ch.Offsets), len(ch.Sizes), D)
		}
		empty := false
		for d := range D {
			o, s := ch.Offsets[d], ch.Sizes[d]
			if o < 0 || s < 0 || o > t.Shape[d]-s {
				return cerr(CoverageOutOfBounds, ch.Offsets, ch.Sizes, "chunk %d exceeds dimension %d", j, d)
			}
			if s == 0 {
				empty = true
			}
		}
		if !empty {
			live = append(live, int32(j))
		}
	}
	if D == 0 {
		switch len(live) {
		case 0:
			return cerr(CoverageGap, nil, nil, "0-dim tensor has no chunk")
		case 1:
			return nil
		default:
			return cerr(CoverageOverlap, nil, nil, "0-dim tensor has %d chunks (chunks %d and %d)", len(live), live[0], live[1])
		}
	}
	if total == 0 {
		return nil
	}
	var a, b int32
	var ok bool
	if len(live) <= smallChunks {
		a, b, ok = overlapPairwise(t.Chunks, live, D)
	} else {
		a, b, ok = findOverlap(t.Chunks, live, D)
	}
	if ok {
		ca, cb := &t.Chunks[a], &t.Chunks[b]
		offs, sizes := make([]int64, D), make([]int64, D)
		for d := range D {
			lo := max(ca.Offsets[d], cb.Offsets[d])
			hi := min(ca.Offsets[d]+ca.Sizes[d], cb.Offsets[d]+cb.Sizes[d])
			offs[d], sizes[d] = lo, hi-lo
		}
		return cerr(CoverageOverlap, offs, sizes, "chunks %d (offsets %v sizes %v) and %d (offsets %v sizes %v) both cover it", a, ca.Offsets, ca.Sizes, b, cb.Offsets, cb.Sizes)
	}
	// Disjoint and in bounds: the volumes cannot overflow and sum to at
	// most total.
	var sum int64
	for _, j := range live {
		sum += statedict.NumElements(t.Chunks[j].Sizes)
	}
	if sum == total {
		return nil
	}
	offs, sizes := findGap(t.Shape, t.Chunks, live)
	return cerr(CoverageGap, offs, sizes, "no chunk covers it (%d of %d elements covered)", sum, total)
}

// smallChunks is the chunk count up to which overlaps are looked for pair
// by pair (at most 120 pairs), without the sweep's index.
const smallChunks = 16

// overlapPairwise returns the first two overlapping live chunks, if any,
// comparing every pair.
func overlapPairwise(chunks []metadata.Chunk, live []int32, D int) (a, b int32, found bool) {
	for i, x := range live {
		for _, y := range live[i+1:] {
			if boxesIntersect(&chunks[x], &chunks[y], D) {
				return min(x, y), max(x, y), true
			}
		}
	}
	return 0, 0, false
}

// boxesIntersect reports whether two chunks of a D-dim tensor share an
// element.
func boxesIntersect(cx, cy *metadata.Chunk, D int) bool {
	for k := range D {
		if max(cx.Offsets[k], cy.Offsets[k]) >= min(cx.Offsets[k]+cx.Sizes[k], cy.Offsets[k]+cy.Sizes[k]) {
			return false
		}
	}
	return true
}

// distinctStarts counts the distinct start offsets of the live chunks on
// each dimension.
func distinctStarts(chunks []metadata.Chunk, live []int32, D int) []int {
	out := make([]int, D)
	buf := make([]int64, len(live))
	for d := range D {
		for i, j := range live {
			buf[i] = chunks[j].Offsets[d]
		}
		slices.Sort(buf)
		out[d] = len(slices.Compact(buf))
		buf = buf[:len(live)]
	}
	return out
}

// bestDims returns the dimension with the most distinct start offsets and,
// for D >= 2, the runner-up (else -1).
func bestDims(counts []int) (first, second int) {
	first, second = 0, -1
	for d := 1; d < len(counts); d++ {
		if counts[d] > counts[first] {
			first = d
		}
	}
	for d := range counts {
		if d != first && (second < 0 || counts[d] > counts[second]) {
			second = d
		}
	}
	return first, second
}

// endHeap is a min-heap of chunk indices by their end on one dimension.
type endHeap struct {
	ids    []int32
	chunks []metadata.Chunk
	dim    int
}

func (h *endHeap) end(i int) int64 {
	c := &h.chunks[h.ids[i]]
	return c.Offsets[h.dim] + c.Sizes[h.dim]
}

func (h *endHeap) push(id int32) {
	h.ids = append(h.ids, id)
	for i := len(h.ids) - 1; i > 0; {
		p := (i - 1) / 2
		if h.end(p) <= h.end(i) {
			break
		}
		h.ids[p], h.ids[i] = h.ids[i], h.ids[p]
		i = p
	}
}

func (h *endHeap) pop() int32 {
	top := h.ids[0]
	last := len(h.ids) - 1
	h.ids[0] = h.ids[last]
	h.ids = h.ids[:last]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < last && h.end(l) < h.end(m) {
			m = l
		}
		if l+1 < last && h.end(l+1) < h.end(m) {
			m = l + 1
		}
		if m == i {
			break
		}
		h.ids[m], h.ids[i] = h.ids[i], h.ids[m]
		i = m
	}
	return top
}

// findOverlap returns two overlapping live chunks, if any. It sweeps along
// dimension d (most distinct starts); the live set holds the chunks whose d
// interval contains the sweep position, sorted by start on dimension e.
// Those chunks are pairwise disjoint, so a new chunk is only compared with
// the live chunks whose e start lies in (start_e - maxLen_e, end_e).
func findOverlap(chunks []metadata.Chunk, live []int32, D int) (a, b int32, found bool) {
	if len(live) < 2 {
		return 0, 0, false
	}
	d, e := bestDims(distinctStarts(chunks, live, D))
	var maxLenE int64
	startE := func(i int32) int64 { return 0 }
	if e >= 0 {
		startE = func(i int32) int64 { return chunks[i].Offsets[e] }
		for _, j := range live {
			maxLenE = max(maxLenE, chunks[j].Sizes[e])
		}
	}
	keyCmp := func(x, y int32) int {
		if c := cmp.Compare(startE(x), startE(y)); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	}
	// Sweep order: start on d, then the live-set order, so that within a
	// band of a grid each insertion appends.
	order := slices.Clone(live)
	slices.SortFunc(order, func(x, y int32) int {
		if c := cmp.Compare(chunks[x].Offsets[d], chunks[y].Offsets[d]); c != 0 {
			return c
		}
		return keyCmp(x, y)
	})
	dead := make([]bool, len(chunks))
	intersects := func(x, y int32) bool { return boxesIntersect(&chunks[x], &chunks[y], D) }
	ends := &endHeap{chunks: chunks, dim: d}
	var active []int32 // sorted by keyCmp
	for _, c := range order {
		x := chunks[c].Offsets[d]
		expired := false
		for len(ends.ids) > 0 && ends.end(0) <= x {
			dead[ends.pop()] = true
			expired = true
		}
		if expired { // one compaction per sweep position
			active = slices.DeleteFunc(active, func(j int32) bool { return dead[j] })
		}
		if e < 0 {
			if len(active) > 0 {
				return active[0], c, true
			}
		} else {
			lo, hi := startE(c)-maxLenE, startE(c)+chunks[c].Sizes[e]
			i := sort.Search(len(active), func(i int) bool { return startE(active[i]) > lo })
			for ; i < len(active) && startE(active[i]) < hi; i++ {
				if intersects(active[i], c) {
					return min(active[i], c), max(active[i], c), true
				}
			}
		}
		if n := len(active); n == 0 || keyCmp(active[n-1], c) < 0 {
			active = append(active, c)
		} else {
			i, _ := slices.BinarySearchFunc(active, c, keyCmp)
			active = slices.Insert(active, i, c)
		}
		ends.push(c)
	}
	return 0, 0, false
}

// findGap locates an uncovered box given disjoint, in-bounds live chunks
// whose volumes sum to less than the tensor's. Dimension by dimension it
// cuts the current region at the chunks' boundaries, picks the first slab
// whose cross-section is not fully covered, and keeps the chunks that
// contain that slab. The result is a box between consecutive chunk
// boundaries on every dimension that no chunk touches.
func findGap(shape []int64, chunks []metadata.Chunk, live []int32) (offs, sizes []int64) {
	D := len(shape)
	offs, sizes = make([]int64, D), make([]int64, D)
	cur := slices.Clone(live)
	for k := range D {
		cross := int64(1)
		for _, s := range shape[k+1:] {
			cross *= s
		}
		bps := make([]int64, 0, 2*len(cur)+2)
		bps = append(bps, 0, shape[k])
		for _, j := range cur {
			c := &chunks[j]
			bps = append(bps, c.Offsets[k], c.Offsets[k]+c.Sizes[k])
		}
		slices.Sort(bps)
		bps = slices.Compact(bps)
		diff := make([]int64, len(bps))
		for _, j := range cur {
			c := &chunks[j]
			v := statedict.NumElements(c.Sizes[k+1:])
			s, _ := slices.BinarySearch(bps, c.Offsets[k])
			t, _ := slices.BinarySearch(bps, c.Offsets[k]+c.Sizes[k])
			diff[s] += v
			diff[t] -= v
		}
		var run int64
		pick := len(bps) - 2 // unreachable fallback: the last slab
		for i := 0; i+1 < len(bps); i++ {
			run += diff[i]
			if run < cross {
				pick = i
				break
			}
		}
		lo, hi := bps[pick], bps[pick+1]
		offs[k], sizes[k] = lo, hi-lo
		cur = slices.DeleteFunc(cur, func(j int32) bool {
			c := &chunks[j]
			return c.Offsets[k] > lo || c.Offsets[k]+c.Sizes[k] < hi
		})
	}
	return offs, sizes
}

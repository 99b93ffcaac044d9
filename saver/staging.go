package saver

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bufpool"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
)

// DefaultStagingBytes is the staging budget of a Saver whose
// AsyncOptions.StagingBytes is 0: 512 MiB, the loader's default staging
// limit too. A state larger than the budget is still saved, in pieces.
const DefaultStagingBytes = 512 << 20

// MinStagingBytes is the smallest staging budget a Saver accepts (1 MiB).
const MinStagingBytes = 1 << 20

// ErrStagingTooSmall is returned when one object of a save cannot fit in
// the staging budget (a byte value larger than the budget: tensors are
// split to fit, byte values cannot be).
var ErrStagingTooSmall = ckpterr.New(ckpterr.Usage, "an item does not fit in the staging budget")

// Page sizes of the staging pool: the budget is cut into pages of
// budget/64 bytes, clamped to [64 KiB, 1 MiB].
const (
	minPage = 64 << 10
	maxPage = 1 << 20
)

// stager holds the staging pool of a Saver: one block of memory of the
// budget's size outside the Go heap (bufpool.Map: huge pages where the
// system allows them), mapped on first use and cut into pages, which are
// handed out as saves need them and reused from save to save. An object
// is staged into whole pages it holds until its Put returns, so a Store
// retry can rewind the body.
type stager struct {
	budget   int64 // in bytes, a multiple of page
	page     int64
	sem      *semaphore.Weighted // counts pages
	prefault bool

	mu   sync.Mutex
	mem  *bufpool.Mapped // nil until first use, and after drop
	next int64           // offset in mem of the first page never handed out
	free [][]byte

	allocated atomic.Int64 // bytes of pages ever handed out (the pool)
	held      atomic.Int64 // bytes of pages held by objects right now
	peak      atomic.Int64 // high-water mark of held
}

func newStager(budget int64, prefault bool) (*stager, error) {
	page := min(max(budget/64, minPage), maxPage)
	pages := budget / page
	s := &stager{budget: pages * page, page: page, sem: semaphore.NewWeighted(pages), prefault: prefault}
	if prefault {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.mapLocked(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// mapLocked maps the pool's memory (s.mu held); with prefault, every page
// is touched now and counted as allocated.
func (s *stager) mapLocked() error {
	m, err := bufpool.Map(int(s.budget))
	if err != nil {
		return fmt.Errorf("saver: staging pool: %w", err)
	}
	s.mem, s.next = m, 0
	if s.prefault {
		m.Prefault()
		for s.next < s.budget {
			s.free = append(s.free, m.Bytes()[s.next:s.next+s.page:s.next+s.page])
			s.next += s.page
		}
		s.allocated.Store(s.budget)
	}
	return nil
}

// share is the largest object a rank writing with the given upload
// concurrency plans while staging: its share of the budget, so that
// `concurrency` objects can be staged and uploading at once.
func (s *stager) share(concurrency int) int64 {
	return max(s.page, s.budget/int64(max(concurrency, 1))/s.page*s.page)
}

// staging is one save's use of a pool: the pool and the gate its uploads
// wait behind.
type staging struct {
	pool *stager
	gate *uploadGate
}

// uploadGate holds a save's uploads back while its staging copies (both
// compete for the processors, and the copy is what blocks the caller): it
// opens when the save is staged, or as soon as staging has to wait for
// budget that only uploads can free.
type uploadGate struct {
	ch   chan struct{}
	once sync.Once
}

func newUploadGate() *uploadGate { return &uploadGate{ch: make(chan struct{})} }

func (g *uploadGate) open() { g.once.Do(func() { close(g.ch) }) }

func (g *uploadGate) wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stage copies parts (size bytes in all) into pages of the pool, waiting
// for the budget while other objects hold it (opening gate first), and
// returns the copy and the function that gives its pages back. reserve
// more bytes of the budget are held with the pages but not allocated:
// room for a copy the backend makes of the body.
func (s *stager) stage(ctx context.Context, size, reserve int64, parts [][]byte, gate *uploadGate) ([][]byte, func(), error) {
	if size+reserve > s.budget {
		return nil, nil, fmt.Errorf("%w: object of %d bytes (+%d reserved for the backend's copy), budget %d bytes; raise the staging budget", ErrStagingTooSmall, size, reserve, s.budget)
	}
	n := (size + s.page - 1) / s.page
	if n == 0 {
		return nil, func() {}, nil
	}
	units := n + (reserve+s.page-1)/s.page
	if !s.sem.TryAcquire(units) {
		gate.open()
		if err := s.sem.Acquire(ctx, units); err != nil {
			return nil, nil, err
		}
	}
	pages, err := s.take(int(n))
	if err != nil {
		s.sem.Release(units)
		return nil, nil, err
	}
	copyParallel(pages, parts, s.page, size)
	body := slices.Clone(pages)
	body[n-1] = body[n-1][:size-(n-1)*s.page]
	var once sync.Once
	release := func() {
		once.Do(func() {
			s.give(pages)
			s.held.Add(-n * s.page)
			s.sem.Release(units)
		})
	}
	return body, release, nil
}

// parallelCopyBytes is the object size from which staging copies with
// several goroutines (one per processor): the copy is the caller's stall.
const parallelCopyBytes = 8 << 20

// copyParallel copies parts back to back over pages (of page bytes each),
// split over up to GOMAXPROCS goroutines by whole pages.
func copyParallel(pages, parts [][]byte, page, size int64) {
	workers := min(int64(runtime.GOMAXPROCS(0)), (size+parallelCopyBytes-1)/parallelCopyBytes)
	if workers <= 1 {
		copyRange(pages, parts, page, 0, size)
		return
	}
	per := (int64(len(pages)) + workers - 1) / workers * page
	var wg sync.WaitGroup
	for lo := int64(0); lo < size; lo += per {
		wg.Go(func() { copyRange(pages, parts, page, lo, min(lo+per, size)) })
	}
	wg.Wait()
}

// copyRange copies bytes [lo, hi) of the parts' concatenation to the same
// offsets of the pages' concatenation (lo a multiple of page).
func copyRange(pages, parts [][]byte, page, lo, hi int64) {
	pi, off := lo/page, int64(0)
	var start int64 // offset of parts[0] in the concatenation
	for _, b := range parts {
		end := start + int64(len(b))
		if end <= lo || len(b) == 0 {
			start = end
			continue
		}
		if start >= hi {
			return
		}
		b = b[max(lo-start, 0):min(int64(len(b)), hi-start)]
		for len(b) > 0 {
			c := copy(pages[pi][off:], b)
			b = b[c:]
			off += int64(c)
			if off == page {
				pi, off = pi+1, 0
			}
		}
		start = end
	}
}

// take returns n pages: free ones first, then pages of the memory never
// handed out (the semaphore already guarantees the pool stays within the
// budget).
func (s *stager) take(n int) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mem == nil {
		if err := s.mapLocked(); err != nil {
			return nil, err
		}
	}
	k := min(n, len(s.free))
	out := slices.Clone(s.free[len(s.free)-k:])
	s.free = s.free[:len(s.free)-k]
	for len(out) < n {
		out = append(out, s.mem.Bytes()[s.next:s.next+s.page:s.next+s.page])
		s.next += s.page
		s.allocated.Add(s.page)
	}
	// Counted as held under mu, so that drop (which unmaps only when
	// nothing is held) can never unmap pages handed out here.
	held := s.held.Add(int64(n) * s.page)
	for {
		p := s.peak.Load()
		if held <= p || s.peak.CompareAndSwap(p, held) {
			break
		}
	}
	return out, nil
}

func (s *stager) give(pages [][]byte) {
	s.mu.Lock()
	s.free = append(s.free, pages...)
	s.mu.Unlock()
}

// drop returns the pool's memory to the operating system when no page is
// held (Close calls it once the save in flight is done); the next save
// maps it again.
func (s *stager) drop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mem == nil || s.held.Load() != 0 {
		return nil
	}
	err := s.mem.Unmap()
	s.mem, s.next, s.free = nil, 0, nil
	s.allocated.Store(0)
	return err
}

// splitItems returns the local plan with every tensor item larger than
// limit bytes cut into chunks of at most limit bytes that tile it, and the
// data slices indexed like the new items. A chunk is cut along its first
// dimension into runs of whole rows; a single row larger than limit is cut
// along the next dimension, and so on, so every piece is contiguous in the
// chunk's row-major bytes. Replicas of a chunk on several ranks are cut
// identically, so the planner still deduplicates them.
func splitItems(lp planner.LocalPlan, data [][]byte, limit int64) (planner.LocalPlan, [][]byte) {
	split := false
	for _, it := range lp.Items {
		if it.Kind == planner.TensorItem && it.Length > limit {
			split = true
			break
		}
	}
	if !split {
		return lp, data
	}
	out := planner.LocalPlan{Rank: lp.Rank}
	var outData [][]byte
	for i, it := range lp.Items {
		if it.Kind != planner.TensorItem || it.Length <= limit {
			out.Items = append(out.Items, it)
			outData = append(outData, data[i])
			continue
		}
		es := int64(metadata.ElementSize(it.DType))
		for _, p := range splitBox(it.Offsets, it.Sizes, es, limit) {
			piece := it
			piece.Offsets, piece.Sizes, piece.Length = p.offsets, p.sizes, p.hi-p.lo
			out.Items = append(out.Items, piece)
			outData = append(outData, data[i][p.lo:p.hi])
		}
	}
	return out, outData
}

// boxPiece is a sub-box of a chunk and its byte range in the chunk's data.
type boxPiece struct {
	offsets, sizes []int64
	lo, hi         int64
}

// splitBox cuts the box (offsets, sizes) of elements of es bytes into
// sub-boxes of at most limit bytes (at least one element each), each a
// contiguous byte range of the box's row-major data.
func splitBox(offsets, sizes []int64, es, limit int64) []boxPiece {
	var out []boxPiece
	var cut func(off, sz []int64, base int64, d int)
	cut = func(off, sz []int64, base int64, d int) {
		slab := es // bytes of one index step along dimension d
		for _, v := range sz[min(d+1, len(sz)):] {
			slab *= v
		}
		n := slab
		if d < len(sz) {
			n *= sz[d]
		}
		if n <= limit || d >= len(sz) {
			out = append(out, boxPiece{offsets: off, sizes: sz, lo: base, hi: base + n})
			return
		}
		step := max(limit/slab, 1)
		for i := int64(0); i < sz[d]; i += step {
			m := min(step, sz[d]-i)
			o, s := slices.Clone(off), slices.Clone(sz)
			o[d] += i
			s[d] = m
			if slab > limit {
				// One index along d is still too big: cut it along d+1.
				cut(o, s, base+i*slab, d+1)
				continue
			}
			out = append(out, boxPiece{offsets: o, sizes: s, lo: base + i*slab, hi: base + (i+m)*slab})
		}
	}
	cut(slices.Clone(offsets), slices.Clone(sizes), 0, 0)
	return out
}

package planner

// slab hands out small slices carved from large shared arrays, so that
// planning a million items makes thousands of allocations, not millions.
// Each slice is capped at its length: appending to it reallocates instead
// of overwriting its neighbour.
type slab[T any] struct{ buf []T }

// take returns a zeroed slice of n elements.
func (s *slab[T]) take(n int) []T {
	if cap(s.buf)-len(s.buf) < n {
		s.buf = make([]T, 0, max(4096, n))
	}
	s.buf = s.buf[:len(s.buf)+n]
	return s.buf[len(s.buf)-n : len(s.buf) : len(s.buf)]
}

// clone returns a copy of src (an empty, non-nil slice for an empty src).
func (s *slab[T]) clone(src []T) []T {
	out := s.take(len(src))
	copy(out, src)
	return out
}

// blockList is an append-only list stored in fixed-size blocks: growing it
// never copies, so a million-element list allocates its size once.
type blockList[T any] struct {
	blocks [][]T
	n      int
}

const blockBits = 14

// push appends v and returns its index.
func (l *blockList[T]) push(v T) int {
	if l.n>>blockBits == len(l.blocks) {
		l.blocks = append(l.blocks, make([]T, 0, 1<<blockBits))
	}
	b := &l.blocks[len(l.blocks)-1]
	*b = append(*b, v)
	l.n++
	return l.n - 1
}

// at returns a pointer to element i.
func (l *blockList[T]) at(i int) *T { return &l.blocks[i>>blockBits][i&(1<<blockBits-1)] }

// each calls fn for every element in order.
func (l *blockList[T]) each(fn func(i int, v *T)) {
	i := 0
	for _, b := range l.blocks {
		for k := range b {
			fn(i, &b[k])
			i++
		}
	}
}

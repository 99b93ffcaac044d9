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

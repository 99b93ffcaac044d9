//go:build !linux

package bufpool

// mapMem allocates n bytes from the Go heap.
func mapMem(n int) (*Mapped, error) {
	return &Mapped{b: make([]byte, n), unmap: func() error { return nil }}, nil
}

// populate reports that the memory must be touched page by page.
func populate([]byte) bool { return false }

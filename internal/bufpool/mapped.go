package bufpool

// Mapped is a block of memory taken from the operating system outside the
// Go heap, for a long-lived pool of large buffers (the async saver's
// staging pool): the garbage collector neither counts it towards its goal
// nor scans it, and on Linux it is backed by transparent huge pages where
// the system allows them (madvise mode), so copying into it takes a page
// fault per 2 MiB instead of per 4 KiB, and few TLB misses. Elsewhere it
// is an ordinary Go allocation.
//
// Pages are faulted in on first touch; Prefault touches them all at once.
// Nothing may use Bytes after Unmap.
type Mapped struct {
	b     []byte
	unmap func() error
}

// HugePage is the huge page size Map aligns its memory to.
const HugePage = 2 << 20

// Map returns n bytes of zeroed memory (see Mapped).
func Map(n int) (*Mapped, error) {
	if n <= 0 {
		return &Mapped{unmap: func() error { return nil }}, nil
	}
	return mapMem(n)
}

// Bytes returns the memory.
func (m *Mapped) Bytes() []byte { return m.b }

// Prefault faults every page of the memory in, writable, keeping its
// contents, so that later use takes no page fault.
func (m *Mapped) Prefault() {
	if len(m.b) == 0 || populate(m.b) {
		return
	}
	// Touch each page: a read-modify-write keeps what it holds.
	for i := 0; i < len(m.b); i += 4096 {
		m.b[i] |= touch
	}
}

// touch is 0, in a variable so that the compiler keeps Prefault's stores.
var touch byte

// Unmap returns the memory to the operating system.
func (m *Mapped) Unmap() error {
	m.b = nil
	return m.unmap()
}

//go:build linux

package bufpool

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapMem maps n bytes, anonymous and private, aligned to HugePage (the
// mapping is that much larger), and advises huge pages for them.
func mapMem(n int) (*Mapped, error) {
	raw, err := unix.Mmap(-1, 0, n+HugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("bufpool: mmap %d bytes: %w", n, err)
	}
	off := 0
	if r := addrOf(raw) % HugePage; r != 0 {
		off = HugePage - int(r)
	}
	b := raw[off : off+n : off+n]
	// EINVAL where transparent huge pages are compiled out or "never":
	// the memory works the same with small pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return &Mapped{b: b, unmap: func() error {
		if err := unix.Munmap(raw); err != nil {
			return fmt.Errorf("bufpool: munmap: %w", err)
		}
		return nil
	}}, nil
}

// populate faults b's pages in, writable (MADV_POPULATE_WRITE, Linux
// 5.14+), and reports whether the kernel did.
func populate(b []byte) bool { return unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil }

// addrOf is the address of b's first byte (b not empty).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

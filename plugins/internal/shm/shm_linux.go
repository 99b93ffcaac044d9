//go:build linux

package shm

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Supported tells whether this system has the shared-memory path.
const Supported = true

// Create makes a segment for l: a close-on-exec memfd of l.Size() bytes,
// sealed against shrinking and growing (so that the plugin cannot truncate
// it and make the host's accesses fault), mapped shared. The caller passes
// the returned file to the plugin (exec.Cmd.ExtraFiles) and closes it once
// the plugin started; the mapping stays valid.
func Create(l Layout) (*Segment, *os.File, error) {
	if err := l.Validate(); err != nil {
		return nil, nil, err
	}
	fd, err := unix.MemfdCreate("ckptkit-plugin-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "ckptkit-plugin-shm")
	fail := func(what string, err error) (*Segment, *os.File, error) {
		f.Close()
		return nil, nil, fmt.Errorf("shm: %s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(l.Size())); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, l.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return &Segment{layout: l, mem: mem}, f, nil
}

// Map maps the segment the host passed as f, after checking that its size
// matches l; it closes f either way.
func Map(f *os.File, l Layout) (*Segment, error) {
	defer f.Close()
	if err := l.Validate(); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: stat segment: %w", err)
	}
	if fi.Size() != int64(l.Size()) {
		return nil, fmt.Errorf("shm: segment holds %d bytes, layout says %d", fi.Size(), l.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, l.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	return &Segment{layout: l, mem: mem}, nil
}

func (s *Segment) unmap() {
	_ = unix.Munmap(s.mem)
	s.mem = nil
}

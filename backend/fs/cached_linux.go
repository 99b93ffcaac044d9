package fs

import (
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxCachedRead caps one non-blocking read. It runs as a raw system call,
// which keeps the goroutine's P (nothing else runs on it meanwhile), so it
// must stay short: 1 MiB from the page cache is about a quarter of a
// millisecond here.
const maxCachedRead = 1 << 20

// cachedReader copies bytes the page cache already holds with
// preadv2(RWF_NOWAIT): such a read never waits for the disk (the kernel
// stops at the first byte it would have to wait for), so it can run as a
// raw system call. A blocking read cannot: the Go scheduler hands the P of
// a goroutine blocked in a system call to another thread, and that
// hand-off on every 256 KiB read cost about 10% of a cached load's CPU
// time (docs/PERFORMANCE.md).
//
// RWF_NOWAIT covers the page cache, not the destination: a destination
// that faults from disk (a file-backed mapping such as np.memmap) or under
// memory-cgroup reclaim waits inside the raw call with the P held, as Go
// code touching such memory would. Kernels before 5.9 may also start (not
// wait for) read-ahead I/O inside it.
type cachedReader struct {
	rc syscall.RawConn // nil: no fast path for this file
}

func (c *cachedReader) init(f *os.File) {
	// The offset goes in one register: 64-bit platforms only.
	if unsafe.Sizeof(uintptr(0)) < 8 {
		return
	}
	if rc, err := f.SyscallConn(); err == nil {
		c.rc = rc
	}
}

// read copies into p what the page cache holds of the bytes from off on,
// stopping at the first byte it does not hold (or at the end of the file)
// and returning how many it copied. refused is set (for the driver's file
// system) when the kernel or the file system refuses such reads.
func (c *cachedReader) read(refused *atomic.Bool, p []byte, at int64) int {
	if c.rc == nil || refused.Load() || len(p) == 0 {
		return 0
	}
	n := 0
	_ = c.rc.Control(func(fd uintptr) {
		for n < len(p) {
			k := min(len(p)-n, maxCachedRead)
			iov := unix.Iovec{Base: &p[n]}
			iov.SetLen(k)
			r, _, e := syscall.RawSyscall6(unix.SYS_PREADV2, fd, uintptr(unsafe.Pointer(&iov)), 1, uintptr(at+int64(n)), 0, unix.RWF_NOWAIT)
			switch {
			case e == 0 && r > 0:
				n += int(r)
				if int(r) < k {
					return // the cache ends here (or the file does)
				}
				continue
			case errors.Is(e, unix.EOPNOTSUPP) || errors.Is(e, unix.ENOSYS) || errors.Is(e, unix.EINVAL) || errors.Is(e, unix.EPERM):
				// No RWF_NOWAIT here (EPERM: a seccomp filter that denies
				// preadv2): blocking reads from now on.
				refused.Store(true)
			}
			return // EAGAIN (not cached), EINTR, the end of the file, any error: the blocking read takes over
		}
	})
	return n
}

package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing f's dirty pages in
// [off, off+n) to the disk without waiting for them (sync_file_range(2)
// with SYNC_FILE_RANGE_WRITE). It is a hint: the fdatasync before publish
// is what makes the bytes durable and reports any write error, so a
// failure here (a file system without support) is ignored.
func startWriteback(f *os.File, off, n int64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}

//go:build !linux

package fs

import "os"

// datasync flushes f's data and metadata (fsync: this system has no
// separate fdatasync in Go's syscall package).
func datasync(f *os.File) error { return f.Sync() }

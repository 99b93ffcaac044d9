//go:build !linux

package shm

import "os"

// Supported tells whether this system has the shared-memory path.
const Supported = false

// Create returns ErrNoSharedMemory outside Linux.
func Create(Layout) (*Segment, *os.File, error) { return nil, nil, ErrNoSharedMemory }

// Map returns ErrNoSharedMemory outside Linux; it closes f.
func Map(f *os.File, _ Layout) (*Segment, error) {
	f.Close()
	return nil, ErrNoSharedMemory
}

func (s *Segment) unmap() { s.mem = nil }

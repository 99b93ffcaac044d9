//go:build amd64 && !purego

package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// fold folds p (a whole number of 256-byte blocks, possibly none) into acc,
// the folded state of the bytes before p.
//
//go:noescape
func fold(acc *[blockSize]byte, p []byte, keys *[8]uint64)

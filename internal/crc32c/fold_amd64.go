//go:build amd64 && !purego

package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// foldBlocks returns the CRC register (not inverted) after p, a whole
// number of 256-byte blocks (at least one), from the register raw.
//
//go:noescape
func foldBlocks(raw uint32, p []byte, keys *[16]uint64) uint32

//go:build !amd64 || purego

package crc32c

const haveFold = false

func foldBlocks(raw uint32, p []byte, keys *[16]uint64) uint32 {
	panic("crc32c: no folding on this CPU")
}

//go:build !amd64 || purego

package crc32c

const haveFold = false

func fold(acc *[blockSize]byte, p []byte, keys *[8]uint64) { panic("crc32c: no folding on this CPU") }

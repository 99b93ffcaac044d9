package crc32c_test

import (
	"hash/crc32"
	"testing"

	"github.com/ckptkit/ckptkit/internal/crc32c"
)

// 256 KiB is the piece the loader checksums while it is hot in cache.
var piece = make([]byte, 256<<10)

func BenchmarkUpdate256KiB(b *testing.B) {
	b.SetBytes(int64(len(piece)))
	for b.Loop() {
		crc32c.Update(0, piece)
	}
}

func BenchmarkHashCRC32Update256KiB(b *testing.B) {
	b.SetBytes(int64(len(piece)))
	for b.Loop() {
		crc32.Update(0, std, piece)
	}
}

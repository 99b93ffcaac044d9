package crc32c_test

import (
	"fmt"

	"github.com/ckptkit/ckptkit/internal/crc32c"
)

// A chunk's CRC-32C computed whole, and as the loader does, piece by piece
// while the bytes arrive.
func ExampleUpdate() {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	crc := uint32(0)
	for p := 0; p < len(chunk); p += 256 << 10 {
		crc = crc32c.Update(crc, chunk[p:p+256<<10])
	}
	fmt.Printf("%08x %v\n", crc32c.Checksum([]byte("123456789")), crc == crc32c.Checksum(chunk))
	// Output: e3069283 true
}

// Package detbytes is the one generator of deterministic test data in
// ckptkit: an endless byte stream per seed in which every byte is a pure
// function of (seed, position), so any range can be produced, streamed or
// checked without holding the whole object. The conformance suite, the
// backend, plugin and operation tests all draw their payloads from it.
package detbytes

import (
	"encoding/binary"
	"io"

	"github.com/ckptkit/ckptkit/statedict"
)

// mix is splitmix64's finaliser: a bijection with good avalanche.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Fill fills dst with the bytes at offset off of the stream of seed: byte p
// of the stream is byte p%8 (little-endian) of mix(seed ^ p/8).
func Fill(dst []byte, seed uint64, off int64) {
	i := 0
	// An unaligned head, byte by byte, up to the next word boundary.
	for ; i < len(dst) && (off+int64(i))&7 != 0; i++ {
		pos := off + int64(i)
		dst[i] = byte(mix(seed^uint64(pos>>3)) >> (8 * (pos & 7)))
	}
	// Whole words: one mix and one store per eight bytes (tests generate
	// large payloads, so no per-byte loop here).
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], mix(seed^uint64((off+int64(i))>>3)))
	}
	// The tail of a last, partial word.
	if i < len(dst) {
		w := mix(seed ^ uint64((off+int64(i))>>3))
		for sh := 0; i < len(dst); sh++ {
			dst[i] = byte(w >> (8 * sh))
			i++
		}
	}
}

// At returns the n bytes at offset off of the stream of seed.
func At(seed uint64, off int64, n int) []byte {
	b := make([]byte, n)
	Fill(b, seed, off)
	return b
}

// Bytes returns the first n bytes of the stream of seed.
func Bytes(seed uint64, n int) []byte { return At(seed, 0, n) }

// Reader streams the first size bytes of the stream of seed without
// holding them. It is deliberately not an io.Seeker, so a Store cannot
// rewind it: a write from it gets exactly one attempt.
type Reader struct {
	seed      uint64
	off, size int64
}

// NewReader returns a Reader of the first size bytes of seed's stream.
func NewReader(seed uint64, size int64) *Reader { return &Reader{seed: seed, size: size} }

// Read implements io.Reader.
func (g *Reader) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	if rem := g.size - g.off; int64(len(p)) > rem {
		p = p[:rem]
	}
	Fill(p, g.seed, g.off)
	g.off += int64(len(p))
	return len(p), nil
}

// Tensor fills t's data with the stream of seed and returns t; bool
// elements are masked to 0 or 1, the only valid bool bytes.
func Tensor(t *statedict.Tensor, seed uint64) *statedict.Tensor {
	Fill(t.Data, seed, 0)
	if t.DType == statedict.Bool {
		for i := range t.Data {
			t.Data[i] &= 1
		}
	}
	return t
}

// Package crc32c computes CRC-32C (the Castagnoli polynomial), the checksum
// ckptkit records for every chunk, object and metadata seal, and the one S3
// and GCS verify server-side.
//
// Results are identical to hash/crc32 with crc32.MakeTable(crc32.Castagnoli).
// On amd64 CPUs with AVX-512 VPCLMULQDQ, inputs of at least FoldMin bytes are
// folded 256 bytes at a time with carry-less multiplications, several times
// faster than the CRC32 instruction hash/crc32 uses; everything else, and
// every other CPU, goes through hash/crc32.
package crc32c

import (
	"context"
	"encoding/binary"
	"hash"
	"hash/crc32"
)

// Size is the size of a CRC-32C checksum in bytes.
const Size = 4

// FoldMin is the shortest input the folding path takes (when the CPU has
// it); shorter inputs cost more to set up than they save.
const FoldMin = 512

// table is hash/crc32's Castagnoli table: the path for short inputs and
// CPUs without the folding instructions.
var table = crc32.MakeTable(crc32.Castagnoli)

// blockSize is how many bytes one folding step consumes: four 512-bit
// accumulators.
const blockSize = 256

// Update returns the result of adding the bytes in p to crc: the same value
// as crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p).
func Update(crc uint32, p []byte) uint32 {
	if !haveFold || len(p) < FoldMin {
		return crc32.Update(crc, table, p)
	}
	n := len(p) &^ (blockSize - 1)
	// crc is the register inverted; so is the result.
	return crc32.Update(^foldBlocks(^crc, p[:n], &foldKeys), table, p[n:])
}

// Piece is how many bytes UpdateContext checksums between two looks at its
// context: a few milliseconds of work, so a cancelled call over a buffer
// of gigabytes stops promptly.
const Piece = 4 << 20

// UpdateContext is Update over p that gives up, returning ctx's error and
// the checksum so far, once ctx is done (looked at before every Piece
// bytes): the form for buffers a caller may cancel the work on.
func UpdateContext(ctx context.Context, crc uint32, p []byte) (uint32, error) {
	for len(p) > 0 {
		if err := ctx.Err(); err != nil {
			return crc, err
		}
		n := min(len(p), Piece)
		crc = Update(crc, p[:n])
		p = p[n:]
	}
	return crc, nil
}

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// New returns a hash.Hash32 computing CRC-32C; Sum appends the checksum in
// big-endian order, like hash/crc32's.
func New() hash.Hash32 { return new(digest) }

type digest struct{ crc uint32 }

func (d *digest) Write(p []byte) (int, error) {
	d.crc = Update(d.crc, p)
	return len(p), nil
}

func (d *digest) Sum(b []byte) []byte { return binary.BigEndian.AppendUint32(b, d.crc) }
func (d *digest) Reset()              { d.crc = 0 }
func (d *digest) Size() int           { return Size }
func (d *digest) BlockSize() int      { return 1 }
func (d *digest) Sum32() uint32       { return d.crc }

// reflectedPoly is the Castagnoli polynomial with bit i holding the
// coefficient of x^(31-i), the bit order of the CRC register.
const reflectedPoly = 0x82f63b78

// xPow returns x^n mod P in the register's bit order.
func xPow(n int) uint64 {
	v := uint32(1 << 31) // x^0
	for range n {
		v = v>>1 ^ reflectedPoly&-(v&1)
	}
	return uint64(v)
}

// foldKeys are the multipliers that move a 128-bit lane further along the
// message: the first eight by 2048 bits (one block, for the main loop),
// the last eight by 512 bits (one 512-bit register, for the final
// reduction), each pair repeated for a register's four lanes. A lane's
// low quadword holds the coefficients of x^127..x^64 (relative to the
// lane's end) and its high quadword those of x^63..x^0; a carry-less
// product of a quadword and a 32-bit key, read as a lane, is multiplied by
// x^33. So moving a lane by d bits multiplies the low quadword by
// x^(d+64-33) and the high one by x^(d-33), both reduced mod P.
var foldKeys = func() (k [16]uint64) {
	for i, d := range []int{blockSize * 8, 512} {
		lo, hi := xPow(d+64-33), xPow(d-33)
		for j := 0; j < 8; j += 2 {
			k[8*i+j], k[8*i+j+1] = lo, hi
		}
	}
	return k
}()

package saver

import (
	"errors"
	"hash/crc32"
	"io"
)

// slicesReader reads a sequence of byte slices back to back without copying
// them into one buffer. It is an io.Seeker so the Store can rewind it to
// retry a transient upload failure.
//
// With hashing on, it also computes each part's CRC32C while copying it, in
// pieces small enough to still be in the cache (no second pass over the
// source): partCRC returns it.
type slicesReader struct {
	parts [][]byte
	size  int64
	pos   int64
	idx   int   // part holding pos
	off   int64 // pos within parts[idx]

	hashed []int64  // per part: bytes [0, hashed) are in crcs (nil: no hashing)
	crcs   []uint32 // per part: CRC32C of its first hashed bytes
}

// hashPiece is the most Read copies before hashing what it copied.
const hashPiece = 256 << 10

// hashing turns on the CRC32C of each part, computed as it is read.
func (r *slicesReader) hashing() *slicesReader {
	r.hashed = make([]int64, len(r.parts))
	r.crcs = make([]uint32, len(r.parts))
	return r
}

// partCRC returns part j's CRC32C: the one computed while it was read when
// it was read whole, otherwise (never read, or read with a gap after a
// seek) computed now.
func (r *slicesReader) partCRC(j int) uint32 {
	if r.hashed != nil && r.hashed[j] == int64(len(r.parts[j])) {
		return r.crcs[j]
	}
	return crc32.Checksum(r.parts[j], castagnoli)
}

func newSlicesReader(parts [][]byte) *slicesReader {
	r := &slicesReader{parts: parts}
	for _, p := range parts {
		r.size += int64(len(p))
	}
	return r
}

func (r *slicesReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.idx < len(r.parts) {
		src := r.parts[r.idx][r.off:]
		if r.hashed != nil && len(src) > hashPiece {
			src = src[:hashPiece]
		}
		c := copy(p[n:], src)
		if r.hashed != nil {
			// Hash the bytes beyond those already hashed (a rewound
			// read copies them again; they have not changed).
			if h := r.hashed[r.idx]; h >= r.off && h < r.off+int64(c) {
				r.crcs[r.idx] = crc32.Update(r.crcs[r.idx], castagnoli, p[n+int(h-r.off):n+c])
				r.hashed[r.idx] = r.off + int64(c)
			}
		}
		n += c
		r.off += int64(c)
		r.pos += int64(c)
		if r.off == int64(len(r.parts[r.idx])) {
			r.idx++
			r.off = 0
		}
	}
	if n == 0 && r.idx >= len(r.parts) {
		return 0, io.EOF
	}
	return n, nil
}

func (r *slicesReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	}
	if offset < 0 || offset > r.size {
		return r.pos, errors.New("slicesReader: seek out of range")
	}
	r.pos, r.idx, r.off = offset, 0, offset
	for r.idx < len(r.parts) && r.off >= int64(len(r.parts[r.idx])) {
		r.off -= int64(len(r.parts[r.idx]))
		r.idx++
	}
	return r.pos, nil
}

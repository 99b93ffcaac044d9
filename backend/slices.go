package backend

import (
	"errors"
	"io"
	"sort"

	"github.com/ckptkit/ckptkit/internal/crc32c"
)

// SlicesReader reads a sequence of byte slices back to back without copying
// them into one buffer: a Put body made of several buffers (the saver's
// items, the C ABI's caller buffers). It is an io.Seeker, so the Store can
// rewind it to retry a transient upload failure.
//
// With HashItems, it also computes the CRC32C of each item (consecutive
// byte ranges of given lengths, independent of how the bytes are split
// into parts) while copying them, in pieces small enough to still be in
// the cache: no second pass over the source.
type SlicesReader struct {
	parts [][]byte
	size  int64
	pos   int64
	idx   int   // part holding pos
	off   int64 // pos within parts[idx]

	ends   []int64  // per item: its end in the stream (nil: no hashing)
	hashed []int64  // per item: the stream position up to which crcs covers it
	crcs   []uint32 // per item: CRC32C of its bytes up to hashed
}

// hashPiece is the most Read copies before hashing what it copied.
const hashPiece = 256 << 10

// writePiece is the most WriteTo hands to one Write when it does not hash:
// few system calls per object.
const writePiece = 8 << 20

// HashItems turns on the CRC32C of items of the given lengths, back to
// back from the start, computed as they are read; ItemCRCs returns them.
func (r *SlicesReader) HashItems(lengths []int64) *SlicesReader {
	r.ends = make([]int64, len(lengths))
	r.hashed = make([]int64, len(lengths))
	r.crcs = make([]uint32, len(lengths))
	var end int64
	for k, n := range lengths {
		r.hashed[k] = end
		end += n
		r.ends[k] = end
	}
	return r
}

// ItemCRCs returns each item's CRC32C (see HashItems) and true when every
// item was read whole since HashItems (false: compute them another way).
func (r *SlicesReader) ItemCRCs() ([]uint32, bool) {
	for k := range r.ends {
		if r.hashed[k] != r.ends[k] {
			return nil, false
		}
	}
	return r.crcs, true
}

// hash adds b, the stream's bytes at pos, to the items it belongs to,
// skipping bytes already hashed (a rewound read copies them again; they
// have not changed).
func (r *SlicesReader) hash(pos int64, b []byte) {
	end := pos + int64(len(b))
	for k := sort.Search(len(r.ends), func(k int) bool { return r.ends[k] > pos }); k < len(r.ends); k++ {
		if h := r.hashed[k]; h >= pos && h < end {
			to := min(end, r.ends[k])
			r.crcs[k] = crc32c.Update(r.crcs[k], b[h-pos:to-pos])
			r.hashed[k] = to
		}
		if r.ends[k] >= end {
			break
		}
	}
}

// NewSlicesReader returns a reader of parts, concatenated.
func NewSlicesReader(parts [][]byte) *SlicesReader {
	r := &SlicesReader{parts: parts}
	for _, p := range parts {
		r.size += int64(len(p))
	}
	return r
}

// Read implements io.Reader.
func (r *SlicesReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.idx < len(r.parts) {
		src := r.parts[r.idx][r.off:]
		if r.ends != nil && len(src) > hashPiece {
			src = src[:hashPiece]
		}
		c := copy(p[n:], src)
		if r.ends != nil {
			r.hash(r.pos, p[n:n+c])
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

// Len returns the number of bytes not yet read (as bytes.Reader.Len).
func (r *SlicesReader) Len() int { return int(r.size - r.pos) }

// WriteTo implements io.WriterTo: it writes the bytes not yet read to w
// straight from the parts, without copying them into a buffer first (a
// file system driver's write then copies each byte once, into the page
// cache). With HashItems on, it writes pieces of at most 256 KiB and hashes
// each right after the write, while the write has left it in the cache
// (hashing first would read it from memory twice as slowly); otherwise
// pieces of at most 8 MiB. On an error the reader stays at the first byte
// not written, so a Seek can rewind it for a retry.
func (r *SlicesReader) WriteTo(w io.Writer) (int64, error) {
	piece := writePiece
	if r.ends != nil {
		piece = hashPiece
	}
	var total int64
	for r.idx < len(r.parts) {
		src := r.parts[r.idx][r.off:]
		if len(src) == 0 {
			r.idx, r.off = r.idx+1, 0
			continue
		}
		if len(src) > piece {
			src = src[:piece]
		}
		n, err := w.Write(src)
		if n > len(src) || n < 0 {
			n = 0
		}
		if err == nil && n < len(src) {
			err = io.ErrShortWrite
		}
		if r.ends != nil {
			r.hash(r.pos, src[:n])
		}
		total += int64(n)
		r.off += int64(n)
		r.pos += int64(n)
		if r.off == int64(len(r.parts[r.idx])) {
			r.idx++
			r.off = 0
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Seek implements io.Seeker.
func (r *SlicesReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	}
	if offset < 0 || offset > r.size {
		return r.pos, errors.New("SlicesReader: seek out of range")
	}
	r.pos, r.idx, r.off = offset, 0, offset
	for r.idx < len(r.parts) && r.off >= int64(len(r.parts[r.idx])) {
		r.off -= int64(len(r.parts[r.idx]))
		r.idx++
	}
	return r.pos, nil
}

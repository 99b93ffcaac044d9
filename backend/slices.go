package backend

import (
	"errors"
	"io"
)

// SlicesReader reads a sequence of byte slices back to back without copying
// them into one buffer: a Put body made of several buffers (the saver's
// items, the C ABI's caller buffers). It is an io.Seeker, so the Store can
// rewind it to retry a transient upload failure.
//
// With a PieceTap (Tap), every piece of the stream is handed to the tap
// right after Read copied it or WriteTo wrote it, in pieces small enough
// to still be in the cache: a checksum computed there (the saver's item
// CRC32Cs) costs no second pass over the source.
type SlicesReader struct {
	parts [][]byte
	size  int64
	pos   int64
	idx   int   // part holding pos
	off   int64 // pos within parts[idx]
	tap   PieceTap
}

// A PieceTap sees the pieces of a SlicesReader's stream (see Tap), each
// with its position in the stream. After a Seek back (a retried upload) it
// is handed those positions again, with the same bytes.
type PieceTap interface {
	Piece(pos int64, b []byte)
}

// tapPiece is the most Read copies, or WriteTo writes, before handing the
// piece to the tap.
const tapPiece = 256 << 10

// writePiece is the most WriteTo hands to one Write when it has no tap:
// few system calls per object.
const writePiece = 8 << 20

// Tap sets the reader's PieceTap and returns the reader.
func (r *SlicesReader) Tap(t PieceTap) *SlicesReader {
	r.tap = t
	return r
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
		if r.tap != nil && len(src) > tapPiece {
			src = src[:tapPiece]
		}
		c := copy(p[n:], src)
		if r.tap != nil {
			r.tap.Piece(r.pos, p[n:n+c])
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
// cache). With a tap, it writes pieces of at most 256 KiB and hands each to
// the tap right after the write, while the write has left it in the cache
// (hashing first would read it from memory twice as slowly); otherwise
// pieces of at most 8 MiB. On an error the reader stays at the first byte
// not written, so a Seek can rewind it for a retry.
func (r *SlicesReader) WriteTo(w io.Writer) (int64, error) {
	piece := writePiece
	if r.tap != nil {
		piece = tapPiece
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
		if r.tap != nil {
			r.tap.Piece(r.pos, src[:n])
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

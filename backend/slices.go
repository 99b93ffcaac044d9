package backend

import (
	"errors"
	"io"
)

// SlicesReader reads a sequence of byte slices back to back without copying
// them into one buffer: a Put body made of several buffers (the saver's
// items, the C ABI's caller buffers). It is an io.Seeker, so the Store can
// rewind it to retry a transient upload failure.
type SlicesReader struct {
	parts [][]byte
	size  int64
	pos   int64
	idx   int   // part holding pos
	off   int64 // pos within parts[idx]
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
		c := copy(p[n:], r.parts[r.idx][r.off:])
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

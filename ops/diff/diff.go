// Package diff compares two checkpoints of any formats the loader reads,
// key by key: keys only on one side, kind (tensor or bytes), dtype and
// shape changes, and content differences, either exactly (SHA-256 of the
// row-major little-endian bytes) or within a tolerance on the maximum
// absolute element difference. It streams: each tensor is read through
// loader.WriteTensor (chunks stored as whole rows streamed through small
// buffers, other layouts in bounded slabs), both sides in step for a
// tolerance comparison, so memory does not follow tensor size.
package diff

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/progress"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// ErrNotNumeric is returned when a tolerance comparison meets a dtype
// it cannot decode as numbers.
var ErrNotNumeric = ckpterr.New(ckpterr.Unsupported, "dtype cannot be compared numerically")

// Kinds of Difference.
const (
	// KindMissing: the key is in A only.
	KindMissing = "missing"
	// KindExtra: the key is in B only.
	KindExtra = "extra"
	// KindKind: a tensor on one side, a bytes value on the other.
	KindKind = "kind"
	// KindDType: both tensors, different dtypes.
	KindDType = "dtype"
	// KindShape: both tensors, same dtype, different shapes.
	KindShape = "shape"
	// KindContent: same dtype and shape (or both bytes), different content.
	KindContent = "content"
)

// Difference is one key that differs.
type Difference struct {
	Key  string
	Kind string
	// A and B describe each side ("float32[4 3]", "bytes(12)", "").
	A string
	B string
	// SHA256A and SHA256B are the content hashes of an exact comparison.
	SHA256A string
	SHA256B string
	// MaxAbsDiff is the largest absolute element difference, and Elements
	// the number of elements beyond the tolerance (tolerance mode only).
	MaxAbsDiff *float64
	Elements   int64
}

// Options tune Compare.
type Options struct {
	// UseTolerance compares tensors numerically: a tensor differs when the
	// maximum absolute difference of its elements exceeds Tolerance.
	// Bytes values are compared as values (sameValue): numbers by value,
	// lists element-wise, so the same state saved in two formats is equal.
	UseTolerance bool
	Tolerance    float64
	// Progress, when set, is called after each key (Unit progress.Keys,
	// the key as Item).
	Progress progress.Func
}

// Report is the outcome of Compare.
type Report struct {
	A string
	B string
	// Keys counts the union of both key sets; Compared the keys present on
	// both sides with the same kind, dtype and shape.
	Keys          int
	Compared      int
	BytesCompared int64
	Tolerance     *float64
	Identical     bool
	Differences   []Difference
}

// Compare compares checkpoints a and b key by key, in key order.
func Compare(ctx context.Context, a, b *loader.Checkpoint, opts Options) (*Report, error) {
	if opts.UseTolerance && (opts.Tolerance < 0 || opts.Tolerance != opts.Tolerance) {
		return nil, fmt.Errorf("diff: tolerance must be a non-negative number, got %v", opts.Tolerance)
	}
	rep := &Report{A: a.URL(), B: b.URL(), Differences: []Difference{}}
	if opts.UseTolerance {
		tol := opts.Tolerance
		rep.Tolerance = &tol
	}
	am, bm := a.Metadata(), b.Metadata()
	keys := allKeys(am, bm)
	rep.Keys = len(keys)
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("diff: %w", err)
		}
		d, n, err := compareKey(ctx, a, b, k, opts)
		if err != nil {
			return nil, err
		}
		rep.BytesCompared += n
		if d != nil {
			rep.Differences = append(rep.Differences, *d)
		}
		if d == nil || d.Kind == KindContent {
			rep.Compared++
		}
		opts.Progress.Report(progress.Update{Done: int64(i + 1), Total: int64(len(keys)), Unit: progress.Keys, Item: k})
	}
	rep.Identical = len(rep.Differences) == 0
	return rep, nil
}

func allKeys(mds ...*metadata.Checkpoint) []string {
	seen := map[string]bool{}
	for _, md := range mds {
		for _, t := range md.Tensors {
			seen[t.Key] = true
		}
		for _, b := range md.Bytes {
			seen[b.Key] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func describe(md *metadata.Checkpoint, key string) string {
	if t := md.Tensor(key); t != nil {
		return fmt.Sprintf("%s%v", t.DType, t.Shape)
	}
	if b := md.BytesValue(key); b != nil {
		return "bytes"
	}
	return ""
}

// compareKey compares one key; it returns nil when the key is the same on
// both sides, and the number of bytes read.
func compareKey(ctx context.Context, a, b *loader.Checkpoint, key string, opts Options) (*Difference, int64, error) {
	am, bm := a.Metadata(), b.Metadata()
	d := &Difference{Key: key, A: describe(am, key), B: describe(bm, key)}
	at, bt := am.Tensor(key), bm.Tensor(key)
	switch {
	case d.B == "":
		d.Kind = KindMissing
		return d, 0, nil
	case d.A == "":
		d.Kind = KindExtra
		return d, 0, nil
	case (at == nil) != (bt == nil):
		d.Kind = KindKind
		return d, 0, nil
	case at != nil && at.DType != bt.DType:
		d.Kind = KindDType
		return d, 0, nil
	case at != nil && !slices.Equal(at.Shape, bt.Shape):
		d.Kind = KindShape
		return d, 0, nil
	}
	d.Kind = KindContent
	if at != nil && opts.UseTolerance {
		m, over, n, err := compareTensors(ctx, a, b, key, statedict.DType(at.DType), opts.Tolerance)
		if err != nil {
			return nil, 0, err
		}
		if over == 0 {
			return nil, n, nil
		}
		d.MaxAbsDiff, d.Elements = &m, over
		return d, n, nil
	}
	if at == nil {
		return compareValues(ctx, a, b, d)
	}
	ha, na, err := hashKey(ctx, a, key, at != nil)
	if err != nil {
		return nil, 0, err
	}
	hb, nb, err := hashKey(ctx, b, key, at != nil)
	if err != nil {
		return nil, 0, err
	}
	if ha == hb {
		return nil, na + nb, nil
	}
	d.SHA256A, d.SHA256B = ha, hb
	return d, na + nb, nil
}

// compareValues compares one bytes key as values (sameValue); it returns
// nil when they are the same, else d with both sides' SHA-256, and the
// number of bytes read.
func compareValues(ctx context.Context, a, b *loader.Checkpoint, d *Difference) (*Difference, int64, error) {
	va, err := a.ReadBytes(ctx, d.Key)
	if err != nil {
		return nil, 0, err
	}
	vb, err := b.ReadBytes(ctx, d.Key)
	if err != nil {
		return nil, 0, err
	}
	n := int64(len(va) + len(vb))
	if sameValue(va, vb) {
		return nil, n, nil
	}
	ha, hb := sha256.Sum256(va), sha256.Sum256(vb)
	d.SHA256A, d.SHA256B = hex.EncodeToString(ha[:]), hex.EncodeToString(hb[:])
	return d, n, nil
}

// hashKey returns the SHA-256 of one key's row-major bytes and their
// number; a tensor is streamed into the hash (loader.WriteTensor, which
// writes exactly its dtype size times its element count, or fails), a
// bytes value read whole.
func hashKey(ctx context.Context, c *loader.Checkpoint, key string, tensor bool) (string, int64, error) {
	h := sha256.New()
	var n int64
	if tensor {
		if err := c.WriteTensor(ctx, key, h); err != nil {
			return "", 0, err
		}
		te := c.Metadata().Tensor(key)
		n = statedict.NumElements(te.Shape) * int64(statedict.DType(te.DType).Size())
	} else {
		b, err := c.ReadBytes(ctx, key)
		if err != nil {
			return "", 0, err
		}
		h.Write(b)
		n = int64(len(b))
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// pieceBytes is the size of the pieces a tolerance comparison takes from
// each side at a time (a multiple of every element size).
const pieceBytes = 1 << 20

// errStopped ends a side's stream once the comparison no longer reads it.
var errStopped = errors.New("diff: comparison stopped")

// compareTensors compares tensor key, of dtype dt and the same shape on
// both sides, element by element: each side is streamed through
// loader.WriteTensor into a pipe and the two are read in step, pieceBytes
// at a time. It returns the largest absolute difference, the number of
// elements beyond tol and the bytes read from both sides. An error on
// either side (a checksum mismatch found at the end of a chunk included)
// is the result, whatever was compared before it.
func compareTensors(ctx context.Context, a, b *loader.Checkpoint, key string, dt statedict.DType, tol float64) (float64, int64, int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type side struct {
		r    *io.PipeReader
		done chan error
		buf  []byte
	}
	start := func(c *loader.Checkpoint) *side {
		pr, pw := io.Pipe()
		s := &side{r: pr, done: make(chan error, 1), buf: make([]byte, pieceBytes)}
		go func() {
			err := c.WriteTensor(ctx, key, pw)
			pw.CloseWithError(err) // nil: the reader sees io.EOF
			s.done <- err
		}()
		return s
	}
	sides := [2]*side{start(a), start(b)}
	// On any return: stop both writers and wait for them, so no goroutine
	// outlives the comparison; a writer's own error wins over errStopped.
	stop := func(err error) error {
		cancel()
		for _, s := range sides {
			s.r.CloseWithError(errStopped)
		}
		for _, s := range sides {
			if werr := <-s.done; err == nil && werr != nil && !errors.Is(werr, errStopped) {
				err = werr
			}
		}
		return err
	}
	var maxDiff float64
	var over, total int64
	for {
		var n [2]int
		var eof [2]bool
		for i, s := range sides {
			k, err := io.ReadFull(s.r, s.buf)
			n[i] = k
			switch {
			case err == io.EOF || err == io.ErrUnexpectedEOF:
				eof[i] = true
			case err != nil:
				return 0, 0, 0, stop(err)
			}
		}
		if n[0] != n[1] || eof[0] != eof[1] {
			return 0, 0, 0, stop(fmt.Errorf("diff %q: the two sides streamed %d and %d bytes at offset %d", key, n[0], n[1], total/2))
		}
		m, o, err := maxAbsDiff(dt, sides[0].buf[:n[0]], sides[1].buf[:n[1]], tol)
		if err != nil {
			return 0, 0, 0, stop(fmt.Errorf("diff %q: %w", key, err))
		}
		maxDiff, over, total = max(maxDiff, m), over+o, total+int64(n[0]+n[1])
		if eof[0] {
			break
		}
	}
	if err := stop(nil); err != nil {
		return 0, 0, 0, err
	}
	return maxDiff, over, total, nil
}

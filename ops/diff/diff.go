// Package diff compares two checkpoints of any formats the loader reads,
// key by key: keys only on one side, kind (tensor or bytes), dtype and
// shape changes, and content differences, either exactly (SHA-256 of the
// row-major little-endian bytes) or within a tolerance on the maximum
// absolute element difference. It streams: one tensor per side is in
// memory at a time.
package diff

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"

	"github.com/ckptkit/ckptkit/ckpterr"

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
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// A and B describe each side ("float32[4 3]", "bytes(12)", "").
	A string `json:"a,omitempty"`
	B string `json:"b,omitempty"`
	// SHA256A and SHA256B are the content hashes of an exact comparison.
	SHA256A string `json:"sha256_a,omitempty"`
	SHA256B string `json:"sha256_b,omitempty"`
	// MaxAbsDiff is the largest absolute element difference, and Elements
	// the number of elements beyond the tolerance (tolerance mode only).
	MaxAbsDiff *float64 `json:"max_abs_diff,omitempty"`
	Elements   int64    `json:"elements_over_tolerance,omitempty"`
}

// Options tune Compare.
type Options struct {
	// UseTolerance compares tensors numerically: a tensor differs when the
	// maximum absolute difference of its elements exceeds Tolerance.
	// Bytes values are always compared exactly.
	UseTolerance bool
	Tolerance    float64
	// Progress, when set, is called after each key.
	Progress func(done, total int, key string)
}

// Report is the outcome of Compare.
type Report struct {
	A string `json:"a"`
	B string `json:"b"`
	// Keys counts the union of both key sets; Compared the keys present on
	// both sides with the same kind, dtype and shape.
	Keys          int          `json:"keys"`
	Compared      int          `json:"compared"`
	BytesCompared int64        `json:"bytes_compared"`
	Tolerance     *float64     `json:"tolerance,omitempty"`
	Identical     bool         `json:"identical"`
	Differences   []Difference `json:"differences"`
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
		if opts.Progress != nil {
			opts.Progress(i+1, len(keys), k)
		}
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
		ta, err := a.ReadTensor(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		tb, err := b.ReadTensor(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		m, over, err := maxAbsDiff(statedict.DType(at.DType), ta.Data, tb.Data, opts.Tolerance)
		if err != nil {
			return nil, 0, fmt.Errorf("diff %q: %w", key, err)
		}
		if over == 0 {
			return nil, int64(len(ta.Data) + len(tb.Data)), nil
		}
		d.MaxAbsDiff, d.Elements = &m, over
		return d, int64(len(ta.Data) + len(tb.Data)), nil
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

// hashKey reads one key and returns the SHA-256 of its row-major bytes;
// the data is dropped before the other side is read.
func hashKey(ctx context.Context, c *loader.Checkpoint, key string, tensor bool) (string, int64, error) {
	var data []byte
	if tensor {
		t, err := c.ReadTensor(ctx, key)
		if err != nil {
			return "", 0, err
		}
		data = t.Data
	} else {
		b, err := c.ReadBytes(ctx, key)
		if err != nil {
			return "", 0, err
		}
		data = b
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), int64(len(data)), nil
}

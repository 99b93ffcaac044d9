package loader

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// SlabBytes bounds the row-major slab WriteTensor assembles at once.
const SlabBytes = 64 << 20

// WriteTensor writes tensor key's row-major little-endian bytes to w in
// bounded pieces, verified, without holding the whole tensor: a tensor
// stored as one raw chunk is streamed from storage through a small buffer
// (its CRC32C checked at the end, so w has then seen unverified bytes: hash
// into w, and discard the result on error); any other layout is assembled
// in slabs of whole leading-dimension rows of at most SlabBytes (each
// through ReadTensorRegion, which reads and checks every chunk a slab
// touches). It is what inspect --hash needs: memory no longer follows
// tensor size.
func (c *Checkpoint) WriteTensor(ctx context.Context, key string, w io.Writer) error {
	te := c.md.Tensor(key)
	if te == nil {
		return fmt.Errorf("read %s: tensor %q: %w", c.URL(), key, planner.ErrKeyNotFound)
	}
	if err := planner.CheckCoverage(te); err != nil {
		return fmt.Errorf("read %s: %w", c.URL(), err)
	}
	dt := statedict.DType(te.DType)
	total := statedict.NumElements(te.Shape) * int64(dt.Size())
	if total == 0 {
		return nil
	}
	if blocks, ok := rowBlocks(te); ok {
		for _, i := range blocks {
			if err := c.streamRawChunk(ctx, te, &te.Chunks[i], w); err != nil {
				return err
			}
		}
		return nil
	}
	if len(te.Shape) == 0 {
		t, err := c.ReadTensor(ctx, key)
		if err != nil {
			return err
		}
		_, err = w.Write(t.Data)
		return err
	}
	rowBytes := total / te.Shape[0]
	rows := max(1, SlabBytes/max(rowBytes, 1))
	for start := int64(0); start < te.Shape[0]; start += rows {
		offsets := make([]int64, len(te.Shape))
		sizes := slices.Clone(te.Shape)
		offsets[0], sizes[0] = start, min(rows, te.Shape[0]-start)
		sh, err := c.ReadTensorRegion(ctx, key, offsets, sizes)
		if err != nil {
			return err
		}
		if _, err := w.Write(sh.Data); err != nil {
			return err
		}
	}
	return nil
}

// rowBlocks returns te's chunks in row-major order when every chunk is
// raw and spans whole leading-dimension rows (the trailing dimensions in
// full): their bytes, one after the other in that order, are the tensor's
// row-major bytes. Chunks with no elements are left out.
func rowBlocks(te *metadata.TensorEntry) ([]int, bool) {
	var idx []int
	for i, ch := range te.Chunks {
		if ch.Encoding != metadata.EncodingRaw || len(ch.Sizes) != len(te.Shape) {
			return nil, false
		}
		for d := 1; d < len(te.Shape); d++ {
			if ch.Offsets[d] != 0 || ch.Sizes[d] != te.Shape[d] {
				return nil, false
			}
		}
		if statedict.NumElements(ch.Sizes) > 0 {
			idx = append(idx, i)
		}
	}
	if len(te.Shape) > 0 {
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(te.Chunks[a].Offsets[0], te.Chunks[b].Offsets[0]) })
	}
	return idx, true
}

// streamRawChunk copies a raw chunk of te to w through streamChecked,
// after checking that the chunk lies within its object.
func (c *Checkpoint) streamRawChunk(ctx context.Context, te *metadata.TensorEntry, ch *metadata.Chunk, w io.Writer) error {
	// Named only when something is wrong (a Sprintf per chunk was most of
	// inspect --hash's garbage for millions of small chunks).
	where := func() string {
		return fmt.Sprintf("key %q in object %s at offset %d (%d bytes)", te.Key, c.store.URL(ch.Object), ch.Offset, ch.Length)
	}
	n, err := c.objectSize(ctx, ch.Object)
	if err != nil {
		return fmt.Errorf("read %s: tensor %q: %w", c.URL(), te.Key, err)
	}
	if ch.Offset > n || ch.Length > n-ch.Offset {
		return fmt.Errorf("read %s: %w: %s is past the object's end (%d bytes stored)", c.URL(), ErrMissingObject, where(), n)
	}
	return c.streamChecked(ctx, ch.Object, ch.Offset, ch.Length, ch.CRC32C, te.DType, where, w)
}

// StreamsChunks reports whether WriteTensor streams te chunk by chunk
// through a small buffer (every chunk raw and spanning whole
// leading-dimension rows), so that writing it costs the same small memory
// whatever its size and chunking; other layouts are assembled in slabs.
func StreamsChunks(te *metadata.TensorEntry) bool {
	_, ok := rowBlocks(te)
	return ok
}

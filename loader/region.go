package loader

import (
	"context"
	"fmt"
	"slices"

	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// ReadTensorRegion reads the box of tensor key that starts at offsets and
// has extent sizes (in elements, per dimension), verified, as a dense
// row-major Shard. Every saved chunk the box touches is read whole (its
// CRC32C covers the whole chunk), so the memory a call needs is the box
// plus the stored size of those chunks. Streaming converters use it to
// move a tensor larger than their memory budget one slab at a time.
func (c *Checkpoint) ReadTensorRegion(ctx context.Context, key string, offsets, sizes []int64) (*statedict.Shard, error) {
	te := c.md.Tensor(key)
	if te == nil {
		return nil, fmt.Errorf("read %s: tensor %q: %w", c.URL(), key, planner.ErrKeyNotFound)
	}
	if err := planner.CheckCoverage(te); err != nil {
		return nil, fmt.Errorf("read %s: %w", c.URL(), err)
	}
	dt := statedict.DType(te.DType)
	sh := &statedict.Shard{DType: dt, GlobalShape: slices.Clone(te.Shape), Offsets: slices.Clone(offsets), Sizes: slices.Clone(sizes)}
	n := statedict.NumElements(sizes)
	if n < 0 || len(offsets) != len(te.Shape) || len(sizes) != len(te.Shape) {
		return nil, fmt.Errorf("read %s: tensor %q: region offsets %v sizes %v does not fit shape %v", c.URL(), key, offsets, sizes, te.Shape)
	}
	sh.Data = make([]byte, n*int64(dt.Size()))
	if err := sh.Check(); err != nil {
		return nil, fmt.Errorf("read %s: tensor %q: %w", c.URL(), key, err)
	}
	if n == 0 {
		return sh, nil
	}
	sd := statedict.New()
	sd.Tensors[key] = sh
	if err := c.readInto(ctx, sd); err != nil {
		return nil, err
	}
	return sh, nil
}

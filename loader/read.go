package loader

import (
	"context"
	"fmt"

	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// ReadTensor reads one whole tensor, reassembled from its chunks and
// verified, through the checkpoint's reader. It is what inspect --hash,
// diff and convert use to stream a checkpoint one tensor at a time.
func (c *Checkpoint) ReadTensor(ctx context.Context, key string) (*statedict.Tensor, error) {
	te := c.md.Tensor(key)
	if te == nil {
		return nil, fmt.Errorf("read %s: tensor %q: %w", c.URL(), key, planner.ErrKeyNotFound)
	}
	if err := planner.CheckCoverage(te); err != nil {
		return nil, fmt.Errorf("read %s: %w", c.URL(), err)
	}
	// Allocation is bounded by what storage really holds: every chunk
	// must lie inside its object as stored (one Stat per object), so a
	// small metadata object cannot make this allocate what no object has.
	for _, ch := range te.Chunks {
		n, err := c.objectSize(ctx, ch.Object)
		if err != nil {
			return nil, fmt.Errorf("read %s: tensor %q: %w", c.URL(), key, err)
		}
		if ch.Offset > n || ch.Length > n-ch.Offset {
			return nil, fmt.Errorf("read %s: tensor %q: %w: chunk [%d,+%d) of %s is past its end (%d bytes stored)",
				c.URL(), key, ErrMissingObject, ch.Offset, ch.Length, c.store.URL(ch.Object), n)
		}
	}
	t := statedict.NewTensor(statedict.DType(te.DType), te.Shape...)
	if len(t.Data) == 0 {
		return t, nil
	}
	sd := statedict.New()
	sd.Tensors[key] = statedict.Whole(t)
	if err := c.readInto(ctx, sd); err != nil {
		return nil, err
	}
	return t, nil
}

// ReadBytes reads one bytes value (decoded for foreign formats).
func (c *Checkpoint) ReadBytes(ctx context.Context, key string) ([]byte, error) {
	if c.md.BytesValue(key) == nil {
		return nil, fmt.Errorf("read %s: bytes %q: %w", c.URL(), key, planner.ErrKeyNotFound)
	}
	sd := statedict.New()
	sd.Bytes[key] = nil
	if err := c.readInto(ctx, sd); err != nil {
		return nil, err
	}
	return sd.Bytes[key], nil
}

// readInto fills every key of sd without the resume rules.
func (c *Checkpoint) readInto(ctx context.Context, sd *statedict.StateDict) error {
	var reqs []planner.ReadRequest
	var owners []keyRef
	for _, k := range sd.Keys() {
		if s, ok := sd.Tensors[k]; ok {
			reqs = append(reqs, planner.ReadRequest{Key: k, Kind: planner.TensorItem, DType: string(s.DType), Offsets: s.Offsets, Sizes: s.Sizes})
		} else {
			reqs = append(reqs, planner.ReadRequest{Key: k, Kind: planner.BytesItem})
		}
		owners = append(owners, keyRef{key: k})
	}
	plan, err := planner.PlanLoad(c.md, reqs, planner.LoadOptions{})
	if err != nil {
		return fmt.Errorf("read %s: %w", c.URL(), err)
	}
	ex := &executor{c: c, plan: plan, owners: owners, targets: []*statedict.StateDict{sd}, conc: 8, maxRead: planner.DefaultMaxReadBytes}
	if err := ex.stream(ctx, true); err != nil {
		return fmt.Errorf("read %s: %w", c.URL(), err)
	}
	return nil
}

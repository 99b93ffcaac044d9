package conformance

import (
	"slices"
	"strings"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/statedict"
)

// fixture is a deterministic training state: full tensors of every dtype,
// a replicated tensor, optimizer state for all but one lazily-absent
// parameter, param groups and scheduler values.
type fixture struct {
	full       map[string]*statedict.Tensor
	bytes      map[string][]byte
	replicated map[string]bool
	// lazyParam (an unrouted expert) has model weights but no optimizer
	// state in the save, while experts.0.weight has all of it.
	lazyParam string
}

func newFixture(seed uint64) *fixture {
	f := &fixture{full: map[string]*statedict.Tensor{}, bytes: map[string][]byte{}, replicated: map[string]bool{}, lazyParam: "experts.1.weight"}
	n := seed << 32
	fill := func(t *statedict.Tensor) *statedict.Tensor { n++; return detbytes.Tensor(t, n) }
	var params []string
	for _, dt := range statedict.DTypes() {
		fqn := "layer_" + string(dt) + ".weight"
		f.full["model."+fqn] = fill(statedict.NewTensor(dt, 7, 3))
		if dt == statedict.Float32 {
			params = append(params, fqn)
		}
	}
	f.full["model.embed.weight"] = fill(statedict.NewTensor(statedict.Float32, 10, 4))
	f.full["model.experts.0.weight"] = fill(statedict.NewTensor(statedict.Float32, 6, 4))
	f.full["model.experts.1.weight"] = fill(statedict.NewTensor(statedict.Float32, 6, 4))
	f.full["model.norm.scale"] = fill(statedict.NewTensor(statedict.Float32, 5))
	f.replicated["model.norm.scale"] = true
	params = append(params, "embed.weight", "norm.scale", "experts.0.weight")
	for _, p := range params {
		w := f.full["model."+p]
		f.full["optimizer.state."+p+".step"] = fill(statedict.NewTensor(statedict.Float32))
		f.full["optimizer.state."+p+".exp_avg"] = fill(statedict.NewTensor(statedict.Float32, w.Shape...))
		f.full["optimizer.state."+p+".exp_avg_sq"] = fill(statedict.NewTensor(statedict.Float32, w.Shape...))
		f.replicated["optimizer.state."+p+".step"] = true
	}
	f.bytes["optimizer.param_groups.0.lr"] = []byte("0.001")
	f.bytes["scheduler.last_epoch"] = []byte("7")
	f.bytes["scheduler.base_lr"] = []byte("0.01")
	return f
}

// shard cuts t for rank of world: replicated keys whole, others by rows.
func (f *fixture) shard(key string, t *statedict.Tensor, rank, world int) *statedict.Shard {
	if f.replicated[key] {
		return statedict.Whole(t)
	}
	return statedict.RowShard(t, rank, world)
}

// saveState returns what each of world ranks saves.
func (f *fixture) saveState(world int) []*statedict.StateDict {
	out := make([]*statedict.StateDict, world)
	for r := range out {
		sd := statedict.New()
		for k, t := range f.full {
			s := f.shard(k, t, r, world)
			if s.NumElements() == 0 && len(s.GlobalShape) > 0 {
				continue
			}
			sd.Tensors[k] = s
		}
		for k, b := range f.bytes {
			sd.Bytes[k] = b
		}
		out[r] = sd
	}
	return out
}

// targets returns zeroed load targets for world ranks, asking for optimizer
// state of every parameter (the lazy one included), as a resuming job does.
func (f *fixture) targets(world int) []*statedict.StateDict {
	want := map[string]*statedict.Tensor{}
	for k, t := range f.full {
		want[k] = t
	}
	lazy := f.full["model."+f.lazyParam]
	want["optimizer.state."+f.lazyParam+".step"] = statedict.NewTensor(statedict.Float32)
	want["optimizer.state."+f.lazyParam+".exp_avg"] = statedict.NewTensor(statedict.Float32, lazy.Shape...)
	want["optimizer.state."+f.lazyParam+".exp_avg_sq"] = statedict.NewTensor(statedict.Float32, lazy.Shape...)
	out := make([]*statedict.StateDict, world)
	for r := range out {
		sd := statedict.New()
		for k, t := range want {
			z := &statedict.Tensor{DType: t.DType, Shape: t.Shape, Data: make([]byte, len(t.Data))}
			sd.Tensors[k] = f.shard(k, z, r, world)
		}
		for k := range f.bytes {
			sd.Bytes[k] = nil
		}
		out[r] = sd
	}
	return out
}

// check asserts every loaded target shard equals the fixture's bytes,
// except keys the fixture lacks and keys for which skip returns true, which
// must be exactly as they were before the load.
func (f *fixture) check(t T, before, targets []*statedict.StateDict, skip func(key string) bool) {
	t.Helper()
	require.Equal(t, len(before), len(targets))
	for r, sd := range targets {
		for k, s := range sd.Tensors {
			full, ok := f.full[k]
			if !ok || skip(k) {
				require.Equal(t, before[r].Tensors[k].Data, s.Data, "rank %d key %q must be left untouched", r, k)
				continue
			}
			want := f.shard(k, full, r, len(targets))
			require.Equal(t, want.Data, s.Data, "rank %d key %q bytes differ", r, k)
		}
		for k, b := range sd.Bytes {
			if skip(k) {
				require.Equal(t, before[r].Bytes[k], b, "rank %d key %q must be left untouched", r, k)
				continue
			}
			require.Equal(t, f.bytes[k], b, "rank %d bytes key %q", r, k)
		}
	}
}

// freshOptimizer fills every optimizer target tensor with a non-zero
// pattern, as the fresh state a resuming job builds (so "left as it was"
// cannot pass by a loader writing zeros).
func freshOptimizer(targets []*statedict.StateDict) {
	n := uint64(0xf5e5)
	for _, sd := range targets {
		for _, k := range sd.Keys() {
			if s, ok := sd.Tensors[k]; ok && isOptimizerKey(k) {
				n++
				detbytes.Fill(s.Data, n, 0)
			}
		}
	}
}

func isOptimizerKey(k string) bool { return strings.HasPrefix(k, "optimizer.") }

func (f *fixture) isLazyKey(k string) bool {
	return strings.HasPrefix(k, "optimizer.state."+f.lazyParam+".")
}

// snapshot deep-copies targets so a failed load can be shown to have left
// them exactly as they were.
func snapshot(targets []*statedict.StateDict) []*statedict.StateDict {
	out := make([]*statedict.StateDict, len(targets))
	for i, sd := range targets {
		out[i] = sd.Clone()
	}
	return out
}

func requireUnchanged(t T, before, after []*statedict.StateDict) {
	t.Helper()
	require.Equal(t, len(before), len(after))
	for r := range before {
		require.ElementsMatch(t, before[r].Keys(), after[r].Keys(), "rank %d keys changed", r)
		for k, s := range before[r].Tensors {
			require.True(t, slices.Equal(s.Data, after[r].Tensors[k].Data), "rank %d tensor %q was modified by a failed load", r, k)
		}
		for k, b := range before[r].Bytes {
			require.Equal(t, b, after[r].Bytes[k], "rank %d bytes %q was modified by a failed load", r, k)
		}
	}
}

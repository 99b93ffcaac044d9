package trainer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/statedict"
)

func train(t *Trainer, steps int) *Trainer {
	for range steps {
		t.Step()
	}
	return t
}

func TestDeterminism(t *testing.T) {
	a, b := train(New(7), 10), train(New(7), 10)
	assert.Equal(t, a.WeightsSHA256(), b.WeightsSHA256())
	assert.Equal(t, a.Loss(), b.Loss())
	assert.NotEqual(t, a.WeightsSHA256(), train(New(8), 10).WeightsSHA256())
	assert.NotEqual(t, New(7).WeightsSHA256(), a.WeightsSHA256(), "training changes the weights")
}

func TestParamNames(t *testing.T) {
	tr := New(1)
	want := []string{
		"embed.bias", "embed.weight", "experts.0.bias", "experts.0.weight",
		"experts.1.bias", "experts.1.weight", "head.bias", "head.weight", "norm.bias", "norm.weight",
	}
	assert.Equal(t, want, tr.ParamNames())
	assert.Equal(t, want, tr.Trainable())
	assert.Equal(t, []int64{16, 8}, tr.ParamShape("embed.weight"))
	assert.Equal(t, []int64{1}, tr.ParamShape("head.bias"))
	assert.Nil(t, tr.ParamShape("nope"))
	assert.Equal(t, []string{"step", "exp_avg", "exp_avg_sq"}, tr.OptimizerSlots())
	assert.Equal(t, want, tr.PrunedOptimizerParams(), "no state before the first step")
}

func TestBatchDependsOnlyOnSeedAndStep(t *testing.T) {
	x1, y1 := New(3).Batch(5)
	x2, y2 := train(New(3), 4).Batch(5)
	assert.Equal(t, x1, x2)
	assert.Equal(t, y1, y2)
	x3, _ := New(3).Batch(6)
	assert.NotEqual(t, x1, x3)
}

func TestLazyExpertState(t *testing.T) {
	tr := train(New(11), 7)
	assert.Equal(t, []string{"experts.1.bias", "experts.1.weight"}, tr.PrunedOptimizerParams())
	assert.False(t, tr.HasOptimizerState("experts.1.weight"))
	sd := tr.StateDicts(1, true)[0]
	assert.NotContains(t, sd.Tensors, OptimizerKey("experts.1.weight", SlotStep))
	assert.Contains(t, sd.Tensors, OptimizerKey("experts.0.weight", SlotStep))

	tr.Step()
	assert.Empty(t, tr.PrunedOptimizerParams())
	assert.Equal(t, float32(1), tr.opt.state["experts.1.weight"].step)
	assert.Equal(t, float32(8), tr.opt.state["experts.0.weight"].step)
}

func TestLossDecreases(t *testing.T) {
	for _, seed := range []uint64{0, 5, 14, 42} {
		tr := New(seed)
		start := tr.EvalLoss()
		var last float32
		for range 12 {
			last = tr.Step()
		}
		assert.Equal(t, last, tr.Loss())
		assert.Less(t, tr.EvalLoss(), 0.99*start, "seed %d: held-out loss %v -> %v", seed, start, tr.EvalLoss())
	}
}

func TestLRSchedule(t *testing.T) {
	tr := New(2)
	for step := 1; step <= 16; step++ {
		want := 0.01
		switch {
		case step > 15:
			want = 0.00125
		case step > 10:
			want = 0.0025
		case step > 5:
			want = 0.005
		}
		assert.Equal(t, want, tr.LR(), "lr of step %d", step)
		tr.Step()
		assert.Equal(t, int64(step), tr.Iteration())
	}
}

// targetsFrom mimics the loader: start from LoadTargets, drop the optimizer
// keys of params absent from the checkpoint, copy saved bytes by key.
func targetsFrom(t *testing.T, src *Trainer, saved []*statedict.StateDict, world int, withOpt bool) ([]*statedict.StateDict, []string) {
	t.Helper()
	targets := src.LoadTargets(world, withOpt)
	pruned := []string{}
	if withOpt {
		pruned = src.PrunedOptimizerParams()
	}
	for r, tg := range targets {
		for _, fqn := range pruned {
			for _, slot := range src.OptimizerSlots() {
				delete(tg.Tensors, OptimizerKey(fqn, slot))
			}
		}
		require.Equal(t, saved[r].Keys(), tg.Keys(), "rank %d keys", r)
		for k, s := range tg.Tensors {
			require.Equal(t, saved[r].Tensors[k].Sizes, s.Sizes, k)
			require.Equal(t, saved[r].Tensors[k].Offsets, s.Offsets, k)
			copy(s.Data, saved[r].Tensors[k].Data)
		}
		for k := range tg.Bytes {
			tg.Bytes[k] = append([]byte(nil), saved[r].Bytes[k]...)
		}
	}
	return targets, pruned
}

func TestResumeMatchesUninterrupted(t *testing.T) {
	const seed, total = 42, 12
	want := train(New(seed), total).WeightsSHA256()
	for _, at := range []int{3, 6, 9} {
		src := train(New(seed), at)
		for world := 1; world <= 4; world++ {
			t.Run(fmt.Sprintf("at%d/world%d", at, world), func(t *testing.T) {
				saved := src.StateDicts(world, true)
				for _, sd := range saved {
					require.NoError(t, sd.Check())
				}
				targets, pruned := targetsFrom(t, src, saved, world, true)
				if at < RouteAllStep {
					assert.Equal(t, []string{"experts.1.bias", "experts.1.weight"}, pruned)
				} else {
					assert.Empty(t, pruned)
				}
				dst := New(seed) // the seed fixes the teacher and the data stream
				require.NotEqual(t, src.WeightsSHA256(), dst.WeightsSHA256())
				require.NoError(t, dst.Restore(targets, src.Iteration(), pruned, true))
				assert.Equal(t, src.WeightsSHA256(), dst.WeightsSHA256())
				assert.Equal(t, src.PrunedOptimizerParams(), dst.PrunedOptimizerParams())
				assert.Equal(t, src.LR(), dst.LR())
				assert.Equal(t, want, train(dst, total-at).WeightsSHA256())
			})
		}
	}
}

func TestResumeWithoutOptimizer(t *testing.T) {
	src := train(New(4), 6)
	saved := src.StateDicts(2, false)
	for _, k := range saved[0].Keys() {
		assert.NotContains(t, k, OptimizerPrefix)
	}
	targets, _ := targetsFrom(t, src, saved, 2, false)
	dst := New(4)
	require.NoError(t, dst.Restore(targets, 6, nil, false))
	assert.Equal(t, src.WeightsSHA256(), dst.WeightsSHA256())
	assert.Equal(t, int64(6), dst.Iteration())
	assert.Equal(t, src.LR(), dst.LR())
	assert.Len(t, dst.PrunedOptimizerParams(), len(dst.Trainable()), "optimizer starts fresh")
}

func TestRestoreErrors(t *testing.T) {
	src := train(New(4), 9)
	fresh := func() []*statedict.StateDict {
		targets, _ := targetsFrom(t, src, src.StateDicts(3, true), 3, true)
		return targets
	}
	dst := New(4)
	before := dst.WeightsSHA256()

	targets := fresh()
	delete(targets[1].Tensors, ModelKey("embed.weight"))
	assert.ErrorContains(t, dst.Restore(targets, 9, nil, true), "embed.weight: element")

	targets = fresh()
	for _, tg := range targets {
		delete(tg.Tensors, OptimizerKey("head.weight", SlotExpAvg))
	}
	assert.ErrorContains(t, dst.Restore(targets, 9, nil, true), "head.weight.exp_avg: missing")

	targets = fresh()
	for _, tg := range targets {
		tg.Bytes[KeyLastEpoch] = nil
	}
	assert.ErrorContains(t, dst.Restore(targets, 9, nil, true), KeyLastEpoch)

	assert.ErrorContains(t, dst.Restore(fresh(), 9, []string{"bogus"}, true), "bogus")
	assert.Equal(t, before, dst.WeightsSHA256(), "failed restores leave the trainer unchanged")
	assert.Equal(t, int64(0), dst.Iteration())
}

func TestStateDictShardsTile(t *testing.T) {
	tr := train(New(1), 9)
	sds := tr.StateDicts(4, true)
	// head.bias has one row: only rank 0 holds it; step is replicated.
	assert.Contains(t, sds[0].Tensors, ModelKey("head.bias"))
	for r := 1; r < 4; r++ {
		assert.NotContains(t, sds[r].Tensors, ModelKey("head.bias"))
		assert.Equal(t, []int64{}, sds[r].Tensors[OptimizerKey("head.bias", SlotStep)].GlobalShape)
		assert.JSONEq(t, "9", string(sds[r].Bytes[KeyLastEpoch]))
	}
	assert.Equal(t, []int64{4, 8}, sds[0].Tensors[ModelKey("embed.weight")].Sizes)
	assert.Equal(t, []int64{12, 0}, sds[3].Tensors[ModelKey("embed.weight")].Offsets)
	assert.JSONEq(t, "[0.9,0.999]", string(sds[2].Bytes[KeyBetas]))
}

// A sized trainer adds the ballast: the state is about the asked size, the
// model trains exactly as without it, and every element of the ballast and
// of its optimizer state changes at every step.
func TestSizedTrainerBallast(t *testing.T) {
	const size = 12 << 20
	tr := NewSized(5, size)
	require.Equal(t, []int64{BallastRows(size), BallastWidth}, tr.ParamShape(BallastName))
	plain := New(5)
	for range 3 {
		require.Equal(t, plain.Step(), tr.Step(), "the ballast does not touch the model's loss")
	}
	var n int64
	for _, s := range tr.StateDicts(1, true)[0].Tensors {
		n += int64(len(s.Data))
	}
	require.InDelta(t, size, n, 64<<10)

	before := tr.StateDicts(1, true)[0]
	tr.Step()
	after := tr.StateViews(1, true)[0]
	for _, slot := range []string{ModelKey(BallastName), OptimizerKey(BallastName, SlotExpAvg), OptimizerKey(BallastName, SlotExpAvgSq)} {
		b, a := before.Tensors[slot].Data, after.Tensors[slot].Data
		for i := 0; i < len(a); i += 4 {
			require.NotEqual(t, b[i:i+4], a[i:i+4], "%s element %d did not change", slot, i/4)
		}
	}
}

// StateViews alias the trainer's memory (a step changes them in place);
// StateDicts are copies. Both restore to the same trainer, at any world.
func TestStateViewsAliasTheTrainer(t *testing.T) {
	tr := train(NewSized(9, 1<<20), 8)
	views := tr.StateViews(3, true)
	copies := tr.StateDicts(3, true)
	key := ModelKey("embed.weight")
	require.Equal(t, copies[0].Tensors[key].Data, views[0].Tensors[key].Data)
	targets, pruned := targetsFrom(t, tr, views, 3, true)
	dst := NewSized(9, 1<<20)
	require.NoError(t, dst.Restore(targets, tr.Iteration(), pruned, true))
	require.Equal(t, tr.WeightsSHA256(), dst.WeightsSHA256())

	snap := slices.Clone(views[0].Tensors[key].Data)
	tr.Step()
	require.NotEqual(t, snap, views[0].Tensors[key].Data, "a view follows the trainer")
	require.Equal(t, snap, copies[0].Tensors[key].Data, "a copy does not")
	require.Equal(t, train(dst, 1).WeightsSHA256(), tr.WeightsSHA256())
}

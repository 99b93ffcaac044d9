package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// optimizerCases are the per-parameter resume rules for optimizers whose
// parameters keep different state (docs/RESUME.md, Per-parameter rules),
// through the public save, load and verify API on the backend under test.
var optimizerCases = []testCase{
	checkpointCase("optimizer/heterogeneous-slots-accepted", caseHeterogeneous(adafactorLike)),
	checkpointCase("optimizer/factored-missing-col-var-rejected", caseFactoredMissing),
	checkpointCase("optimizer/merged-optimizers-accepted", caseHeterogeneous(muonAdamWLike)),
	checkpointCase("optimizer/amsgrad-one-group-accepted", caseHeterogeneous(amsgradOneGroup)),
}

// optParam is one parameter of an optimizer layout: its shape, param
// group, and the slots (name: shape) of its optimizer state; lazy ones
// never received a gradient, so the checkpoint holds none of them.
type optParam struct {
	fqn   string
	shape []int64
	group int
	slots map[string][]int64
	lazy  bool
}

// optLayout is a model and the per-parameter optimizer state of one
// optimizer (or several, merged) after a few steps.
type optLayout struct {
	name   string
	params []optParam
	// subsetDecides is true when the subset rule alone (no census, no
	// param groups) accepts the layout too.
	subsetDecides bool
}

// adafactorLike keeps row_var and col_var for matrices, variance for
// vectors: no slot set is the union of the others.
func adafactorLike() optLayout {
	factored := func(r, c int64) map[string][]int64 {
		return map[string][]int64{"step": {}, "row_var": {r}, "col_var": {c}}
	}
	return optLayout{name: "adafactor", subsetDecides: true, params: []optParam{
		{fqn: "enc.weight", shape: []int64{6, 4}, slots: factored(6, 4)},
		{fqn: "enc.bias", shape: []int64{6}, slots: map[string][]int64{"step": {}, "variance": {6}}},
		{fqn: "dec.weight", shape: []int64{4, 6}, slots: factored(4, 6)},
		{fqn: "experts.1.weight", shape: []int64{6, 4}, slots: factored(6, 4), lazy: true},
		{fqn: "experts.1.bias", shape: []int64{6}, slots: map[string][]int64{"step": {}, "variance": {6}}, lazy: true},
	}}
}

// muonAdamWLike is two optimizers' state merged into one (Muon for the
// matrices, AdamW for the rest), each in its own param group.
func muonAdamWLike() optLayout {
	adamw := func(shape ...int64) map[string][]int64 {
		return map[string][]int64{"step": {}, "exp_avg": shape, "exp_avg_sq": shape}
	}
	return optLayout{name: "muon+adamw", subsetDecides: true, params: []optParam{
		{fqn: "blocks.0.weight", shape: []int64{6, 4}, slots: map[string][]int64{"momentum_buffer": {6, 4}}},
		{fqn: "blocks.1.weight", shape: []int64{6, 4}, slots: map[string][]int64{"momentum_buffer": {6, 4}}, lazy: true},
		{fqn: "blocks.0.bias", shape: []int64{6}, group: 1, slots: adamw(6)},
		{fqn: "head.bias", shape: []int64{4}, group: 1, slots: adamw(4), lazy: true},
	}}
}

// amsgradOneGroup is AdamW with amsgrad in its first param group only:
// max_exp_avg_sq there, not in the second (whose slots are a subset, so
// only the census or the groups tell this from a lost slot).
func amsgradOneGroup() optLayout {
	adamw := func(amsgrad bool, shape ...int64) map[string][]int64 {
		s := map[string][]int64{"step": {}, "exp_avg": shape, "exp_avg_sq": shape}
		if amsgrad {
			s["max_exp_avg_sq"] = shape
		}
		return s
	}
	return optLayout{name: "amsgrad-one-group", params: []optParam{
		{fqn: "a.weight", shape: []int64{6, 4}, slots: adamw(true, 6, 4)},
		{fqn: "b.weight", shape: []int64{6, 4}, group: 1, slots: adamw(false, 6, 4)},
		{fqn: "c.weight", shape: []int64{6, 4}, group: 1, slots: adamw(false, 6, 4), lazy: true},
		{fqn: "d.weight", shape: []int64{6, 4}, slots: adamw(true, 6, 4), lazy: true},
	}}
}

// full returns every saved tensor and bytes value of the layout, and the
// load target's tensors (the lazy parameters' fresh state included).
func (l optLayout) full(seed uint64) (saved, target map[string]*statedict.Tensor, values map[string][]byte) {
	saved, target, values = map[string]*statedict.Tensor{}, map[string]*statedict.Tensor{}, map[string][]byte{}
	n := seed << 32
	fill := func(t *statedict.Tensor) *statedict.Tensor { n++; return detbytes.Tensor(t, n) }
	var groups [][]string
	for _, p := range l.params {
		w := fill(statedict.NewTensor(statedict.Float32, p.shape...))
		saved["model."+p.fqn], target["model."+p.fqn] = w, w
		for g := len(groups); g <= p.group; g++ {
			groups = append(groups, nil)
		}
		groups[p.group] = append(groups[p.group], p.fqn)
		for slot, shape := range p.slots {
			k := statedict.StateKey(statedict.DefaultOptimizerPrefix, p.fqn, slot)
			s := fill(statedict.NewTensor(statedict.Float32, shape...))
			target[k] = s
			if !p.lazy {
				saved[k] = s
			}
		}
	}
	for g, fqns := range groups {
		b, _ := json.Marshal(fqns)
		values[statedict.ParamGroupKey(statedict.DefaultOptimizerPrefix, g, statedict.ParamsField)] = b
		values[statedict.ParamGroupKey(statedict.DefaultOptimizerPrefix, g, "lr")] = []byte(fmt.Sprint(0.01 * float64(g+1)))
	}
	return saved, target, values
}

func (l optLayout) lazy() []string {
	var out []string
	for _, p := range l.params {
		if p.lazy {
			out = append(out, p.fqn)
		}
	}
	slices.Sort(out)
	return out
}

// shardOf cuts a tensor by rows over world ranks (scalars whole).
func shardOf(t *statedict.Tensor, rank, world int) *statedict.Shard {
	if len(t.Shape) == 0 || t.Shape[0] < int64(world) {
		return statedict.Whole(t)
	}
	return statedict.RowShard(t, rank, world)
}

// saveLayout saves the layout from 2 ranks and returns the load targets
// for world ranks: zeroed model keys, and fresh (non-zero) optimizer state
// for every parameter, as a resuming job builds it.
func saveLayout(t T, st *backend.Store, l optLayout, seed uint64) (saved map[string]*statedict.Tensor, values map[string][]byte) {
	saved, _, values = l.full(seed)
	sds := make([]*statedict.StateDict, 2)
	for r := range sds {
		sd := statedict.New()
		for k, ten := range saved {
			if s := shardOf(ten, r, 2); s.NumElements() > 0 || len(ten.Shape) == 0 {
				sd.Tensors[k] = s
			}
		}
		for k, v := range values {
			sd.Bytes[k] = v
		}
		sds[r] = sd
	}
	_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{Iteration: 3})
	require.NoError(t, err, "save %s to %s", l.name, st)
	return saved, values
}

func layoutTargets(l optLayout, seed uint64, world int) []*statedict.StateDict {
	_, target, values := l.full(seed)
	out := make([]*statedict.StateDict, world)
	for r := range out {
		sd := statedict.New()
		for k, ten := range target {
			z := &statedict.Tensor{DType: ten.DType, Shape: ten.Shape, Data: make([]byte, len(ten.Data))}
			sd.Tensors[k] = shardOf(z, r, world)
		}
		for k := range values {
			sd.Bytes[k] = nil
		}
		out[r] = sd
	}
	freshOptimizer(out)
	return out
}

// caseHeterogeneous: parameters of one checkpoint hold different slot sets
// (layout l); every one is whole. The load of a target built from the
// optimizer's own fresh state (each parameter's slots) succeeds at 1 and 2
// ranks, bit for bit, leaving exactly the lazy parameters fresh and
// naming them; verify (census) calls it resumable with exactly those lazy
// parameters; so does the subset rule where it suffices (the census
// stripped, as in a checkpoint written before it).
func caseHeterogeneous(layout func() optLayout) func(t T, h *Harness) {
	return func(t T, h *Harness) {
		ctx := context.Background()
		l := layout()
		st := h.NewStore(t)
		saved, values := saveLayout(t, st, l, 21)
		for _, world := range []int{1, 2} {
			targets := layoutTargets(l, 21, world)
			before := snapshot(targets)
			rep, err := loader.Load(ctx, st, targets, quietLoad())
			require.NoError(t, err, "%s, %d ranks", l.name, world)
			require.Equal(t, l.lazy(), rep.LazyParams, "%s: exactly the lazy parameters", l.name)
			require.True(t, rep.OptimizerLoaded)
			for r, sd := range targets {
				for k, s := range sd.Tensors {
					full, ok := saved[k]
					if !ok {
						require.Equal(t, before[r].Tensors[k].Data, s.Data, "%s rank %d: %s must be left fresh", l.name, r, k)
						continue
					}
					require.Equal(t, shardOf(full, r, world).Data, s.Data, "%s rank %d: %s", l.name, r, k)
				}
				for k, b := range sd.Bytes {
					require.Equal(t, values[k], b, "%s rank %d: %s", l.name, r, k)
				}
			}
		}
		vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
		require.NoError(t, err)
		require.True(t, vr.Resumable, "%s: %+v", l.name, vr.Problems)
		require.Equal(t, l.lazy(), vr.LazyParams)
		if l.subsetDecides {
			rewriteMetadata(t, st, stripCensus)
			vr, err := loader.Verify(ctx, st, loader.VerifyOptions{})
			require.NoError(t, err)
			require.True(t, vr.Resumable, "%s without its census: %+v", l.name, vr.Problems)
			require.Equal(t, l.lazy(), vr.LazyParams)
		}
	}
}

func stripCensus(md *metadata.Checkpoint) {
	md.Training.SlotSets, md.Training.ParamSlots = nil, nil
}

// caseFactoredMissing: an Adafactor-like checkpoint whose one matrix lost
// col_var (row_var and step still there) is partial: the load refuses it
// naming that key only, before any target byte changes; verify refuses it
// by the census and, without one, by the subset rule, naming only it.
func caseFactoredMissing(t T, h *Harness) {
	l := adafactorLike()
	st := h.NewStore(t)
	saveLayout(t, st, l, 22)
	const gone = "optimizer.state.dec.weight.col_var"
	rewriteMetadata(t, st, func(md *metadata.Checkpoint) {
		i := slices.IndexFunc(md.Tensors, func(e metadata.TensorEntry) bool { return e.Key == gone })
		require.GreaterOrEqual(t, i, 0, "the fixture saved %s", gone)
		md.Tensors = slices.Delete(md.Tensors, i, i+1)
	})
	expectRejectedInto(t, st, layoutTargets(l, 22, 2), quietLoad(), loader.ErrPartialOptimizerState, `"dec.weight"`, "lacks "+gone)
	for _, census := range []bool{true, false} {
		if !census {
			rewriteMetadata(t, st, stripCensus)
		}
		vr, err := loader.Verify(context.Background(), st, loader.VerifyOptions{})
		require.NoError(t, err)
		require.False(t, vr.Resumable)
		require.Len(t, vr.Problems, 1, "census %v: %+v", census, vr.Problems)
		p := vr.Problems[0]
		assert.Equal(t, loader.RulePartialOptimizer, p.Rule)
		_, lacks, _ := strings.Cut(p.Message, "lacks ")
		assert.True(t, strings.HasPrefix(lacks, gone+" "), "census %v: only %s is named missing: %s", census, gone, p.Message)
	}
}

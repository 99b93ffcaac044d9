package trainer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/ckptkit/ckptkit/statedict"
)

// Key prefixes of the trainer's flattened state (statedict's defaults).
const (
	ModelPrefix     = statedict.DefaultModelPrefix
	OptimizerPrefix = statedict.DefaultOptimizerPrefix
	SchedulerPrefix = statedict.DefaultSchedulerPrefix
)

// Byte keys of the trainer's flattened state.
var (
	KeyLR          = statedict.ParamGroupKey(OptimizerPrefix, 0, "lr")
	KeyBetas       = statedict.ParamGroupKey(OptimizerPrefix, 0, "betas")
	KeyEps         = statedict.ParamGroupKey(OptimizerPrefix, 0, "eps")
	KeyWeightDecay = statedict.ParamGroupKey(OptimizerPrefix, 0, "weight_decay")
	KeyLastEpoch   = SchedulerPrefix + ".last_epoch"
	KeyBaseLR      = SchedulerPrefix + ".base_lr"
)

// ModelKey returns the state key of parameter fqn ("model.<fqn>").
func ModelKey(fqn string) string { return statedict.ModelKey(ModelPrefix, fqn) }

// OptimizerKey returns the state key of a parameter's optimizer slot
// ("optimizer.state.<fqn>.<slot>").
func OptimizerKey(fqn, slot string) string { return statedict.StateKey(OptimizerPrefix, fqn, slot) }

// StateDicts returns one StateDict per rank of a world of `world` ranks
// (world >= 1): parameters and optimizer slots row-sharded on dim 0 with
// statedict.RowShard (zero-element shards omitted), the 0-dim step slots
// and the JSON byte values replicated on every rank. Optimizer state keys
// exist only for parameters that have state. Data are copies.
func (t *Trainer) StateDicts(world int, withOptimizer bool) []*statedict.StateDict {
	return t.stateDicts(world, withOptimizer, true)
}

// StateViews is StateDicts without copies: every tensor's Data is the
// trainer's own memory (on little-endian hosts; a copy elsewhere), valid
// until the next Step or Restore, which change it in place. Byte values are
// fresh. It is what a save reads: a synchronous save is done before the next
// step, an asynchronous one has staged (copied) the bytes when it returns.
func (t *Trainer) StateViews(world int, withOptimizer bool) []*statedict.StateDict {
	return t.stateDicts(world, withOptimizer, false)
}

func (t *Trainer) stateDicts(world int, withOptimizer, copyData bool) []*statedict.StateDict {
	out := make([]*statedict.StateDict, world)
	for r := range out {
		out[r] = statedict.New()
	}
	put := func(key string, shape []int64, v []float32) {
		tensor := &statedict.Tensor{DType: statedict.Float32, Shape: shape, Data: f32View(v)}
		for r, sd := range out {
			if s := statedict.RowShard(tensor, r, world); s.NumElements() > 0 {
				if copyData {
					s.Data = slices.Clone(s.Data)
				}
				sd.Tensors[key] = s
			}
		}
	}
	for _, p := range t.params {
		put(ModelKey(p.name), p.shape, p.data)
		if st := t.opt.state[p.name]; withOptimizer && st != nil {
			put(OptimizerKey(p.name, SlotStep), []int64{}, []float32{st.step})
			put(OptimizerKey(p.name, SlotExpAvg), p.shape, st.expAvg)
			put(OptimizerKey(p.name, SlotExpAvgSq), p.shape, st.expAvgSq)
		}
	}
	bytes := map[string]any{KeyLastEpoch: t.sched.lastEpoch, KeyBaseLR: t.sched.baseLR}
	if withOptimizer {
		bytes[KeyLR] = t.opt.lr
		bytes[KeyBetas] = []float64{t.opt.beta1, t.opt.beta2}
		bytes[KeyEps] = t.opt.eps
		bytes[KeyWeightDecay] = t.opt.weightDecay
	}
	for k, v := range bytes {
		b, err := json.Marshal(v)
		if err != nil {
			panic(fmt.Errorf("trainer: marshal %s: %w", k, err)) // numbers and slices always marshal
		}
		for _, sd := range out {
			sd.Bytes[k] = slices.Clone(b)
		}
	}
	return out
}

// LoadTargets returns one zero-filled load target per rank with the keys
// and geometry of StateDicts, except that optimizer state is requested for
// every trainable parameter (the loader drops the ones a checkpoint lacks).
// Byte keys are present with nil values.
func (t *Trainer) LoadTargets(world int, withOptimizer bool) []*statedict.StateDict {
	out := make([]*statedict.StateDict, world)
	for r := range out {
		out[r] = statedict.New()
	}
	put := func(key string, shape []int64) {
		tensor := statedict.NewTensor(statedict.Float32, shape...)
		for r, sd := range out {
			if s := statedict.RowShard(tensor, r, world); s.NumElements() > 0 {
				s.Data = make([]byte, len(s.Data))
				sd.Tensors[key] = s
			}
		}
	}
	keys := []string{KeyLastEpoch, KeyBaseLR}
	for _, p := range t.params {
		put(ModelKey(p.name), p.shape)
		if withOptimizer {
			put(OptimizerKey(p.name, SlotStep), []int64{})
			put(OptimizerKey(p.name, SlotExpAvg), p.shape)
			put(OptimizerKey(p.name, SlotExpAvgSq), p.shape)
		}
	}
	if withOptimizer {
		keys = append(keys, KeyLR, KeyBetas, KeyEps, KeyWeightDecay)
	}
	for _, sd := range out {
		for _, k := range keys {
			sd.Bytes[k] = nil
		}
	}
	return out
}

// Restore rebuilds the trainer from filled per-rank targets (any world
// size; row shards are reassembled by their offsets and must tile each
// tensor exactly). Parameters in prunedParams get no optimizer state
// (fresh, lazy); every other trainable parameter must have all its slots.
// Without the optimizer, optimizer state is left fresh but the iteration
// and the scheduler are restored. On error the trainer is unchanged.
func (t *Trainer) Restore(targets []*statedict.StateDict, iteration int64, prunedParams []string, withOptimizer bool) error {
	if len(targets) == 0 {
		return errors.New("trainer: restore: no targets")
	}
	if iteration < 0 {
		return fmt.Errorf("trainer: restore: negative iteration %d", iteration)
	}
	data := make(map[string][]float32, len(t.params))
	for _, p := range t.params {
		v, err := assemble(targets, ModelKey(p.name), p.shape)
		if err != nil {
			return fmt.Errorf("trainer: restore: %w", err)
		}
		data[p.name] = v
	}
	sched := &stepLR{}
	if err := getJSON(targets, KeyLastEpoch, &sched.lastEpoch); err != nil {
		return fmt.Errorf("trainer: restore: %w", err)
	}
	if err := getJSON(targets, KeyBaseLR, &sched.baseLR); err != nil {
		return fmt.Errorf("trainer: restore: %w", err)
	}
	opt := newAdamW()
	opt.lr = sched.lr()
	if withOptimizer {
		if err := t.restoreOptimizer(opt, targets, prunedParams); err != nil {
			return fmt.Errorf("trainer: restore: %w", err)
		}
	}
	for _, p := range t.params {
		copy(p.data, data[p.name])
	}
	t.opt, t.sched, t.iteration, t.loss = opt, sched, iteration, 0
	return nil
}

func (t *Trainer) restoreOptimizer(opt *adamW, targets []*statedict.StateDict, prunedParams []string) error {
	var betas []float64
	for key, dst := range map[string]any{KeyLR: &opt.lr, KeyBetas: &betas, KeyEps: &opt.eps, KeyWeightDecay: &opt.weightDecay} {
		if err := getJSON(targets, key, dst); err != nil {
			return err
		}
	}
	if len(betas) != 2 {
		return fmt.Errorf("%s: want 2 betas, got %v", KeyBetas, betas)
	}
	opt.beta1, opt.beta2 = betas[0], betas[1]
	for _, fqn := range prunedParams {
		if _, ok := t.byName[fqn]; !ok {
			return fmt.Errorf("pruned parameter %q is not a parameter of the model", fqn)
		}
	}
	for _, p := range t.params {
		if slices.Contains(prunedParams, p.name) {
			continue
		}
		step, err := assemble(targets, OptimizerKey(p.name, SlotStep), []int64{})
		if err != nil {
			return err
		}
		st := &adamState{step: step[0]}
		if st.step < 1 || st.step != float32(math.Trunc(float64(st.step))) {
			return fmt.Errorf("%s: invalid step %v", OptimizerKey(p.name, SlotStep), st.step)
		}
		if st.expAvg, err = assemble(targets, OptimizerKey(p.name, SlotExpAvg), p.shape); err != nil {
			return err
		}
		if st.expAvgSq, err = assemble(targets, OptimizerKey(p.name, SlotExpAvgSq), p.shape); err != nil {
			return err
		}
		opt.state[p.name] = st
	}
	return nil
}

// assemble reassembles a float32 tensor of the given global shape from the
// row shards under key in every target. Every element must be covered
// exactly once, except that identical replicas of a 0-dim tensor are fine.
func assemble(targets []*statedict.StateDict, key string, shape []int64) ([]float32, error) {
	n := statedict.NumElements(shape)
	rowElems := int64(1)
	for _, d := range shape[min(1, len(shape)):] {
		rowElems *= d
	}
	out := make([]float32, n)
	covered := make([]uint8, n) // saturates at 255: only 1 is valid anyway
	found := false
	for r, sd := range targets {
		s, ok := sd.Tensors[key]
		if !ok {
			continue
		}
		found = true
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("%s on rank %d: %w", key, r, err)
		}
		if s.DType != statedict.Float32 || !slices.Equal(s.GlobalShape, shape) {
			return nil, fmt.Errorf("%s on rank %d: got %s%v, want float32%v", key, r, s.DType, s.GlobalShape, shape)
		}
		if len(shape) > 1 && !slices.Equal(s.Sizes[1:], shape[1:]) {
			return nil, fmt.Errorf("%s on rank %d: chunk sizes %v are not whole rows of %v", key, r, s.Sizes, shape)
		}
		var lo int64
		if len(shape) > 0 {
			lo = s.Offsets[0] * rowElems
		}
		for i := range s.NumElements() {
			v := math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:]))
			if len(shape) == 0 && covered[0] > 0 {
				if math.Float32bits(v) != math.Float32bits(out[0]) {
					return nil, fmt.Errorf("%s: replicas differ (%v on rank %d, %v before)", key, v, r, out[0])
				}
				continue
			}
			out[lo+i] = v
			covered[lo+i] = min(covered[lo+i], 254) + 1
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: missing on every rank", key)
	}
	for i, c := range covered {
		if c != 1 {
			return nil, fmt.Errorf("%s: element %d covered %d times, want exactly once", key, i, c)
		}
	}
	return out, nil
}

// getJSON decodes the byte value key from the first target that has a
// non-empty one.
func getJSON(targets []*statedict.StateDict, key string, dst any) error {
	for _, sd := range targets {
		if b := sd.Bytes[key]; len(b) > 0 {
			if err := json.Unmarshal(b, dst); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: missing or empty on every rank", key)
}

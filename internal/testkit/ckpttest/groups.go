package ckpttest

import (
	"encoding/json"

	"github.com/ckptkit/ckptkit/statedict"
)

// GroupedState is the training state of an AdamW optimizer over the param
// groups groups (each a list of fqns): "model.<fqn>" and the exp_avg and
// exp_avg_sq slots of every fqn (n float32 elements each, byte i holding
// i+1, mod 256), its step (a 0-dim tensor), and each group's
// "optimizer.param_groups.<i>.params" value, the JSON list of its fqns.
func GroupedState(n int64, groups ...[]string) *statedict.StateDict {
	sd := statedict.New()
	opt := statedict.DefaultOptimizerPrefix
	tensor := func(shape ...int64) *statedict.Shard {
		t := statedict.NewTensor(statedict.Float32, shape...)
		for i := range t.Data {
			t.Data[i] = byte(i + 1)
		}
		return statedict.Whole(t)
	}
	for i, g := range groups {
		for _, f := range g {
			sd.Tensors[statedict.ModelKey(statedict.DefaultModelPrefix, f)] = tensor(n)
			sd.Tensors[statedict.StateKey(opt, f, statedict.SlotStep)] = tensor()
			sd.Tensors[statedict.StateKey(opt, f, statedict.SlotExpAvg)] = tensor(n)
			sd.Tensors[statedict.StateKey(opt, f, statedict.SlotExpAvgSq)] = tensor(n)
		}
		names, err := json.Marshal(g)
		if err != nil {
			panic(err) // a []string always marshals
		}
		sd.Bytes[statedict.ParamGroupKey(opt, i, statedict.ParamsField)] = names
	}
	return sd
}

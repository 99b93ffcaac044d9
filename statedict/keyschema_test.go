package statedict_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ckptkit/ckptkit/statedict"
)

// StateKeys splits by the longest known parameter name, so a slot is
// whatever follows it (any optimizer's, a nested value's dotted path); a
// key of no known parameter splits at its last dot.
func TestStateKeysSplit(t *testing.T) {
	sk := statedict.NewStateKeys("optimizer", "a", "a.b", "layers.0.weight")
	for _, c := range []struct{ key, fqn, slot string }{
		{"optimizer.state.a.b.exp_avg", "a.b", "exp_avg"},
		{"optimizer.state.a.row_var", "a", "row_var"},
		{"optimizer.state.layers.0.weight.momentum_buffer", "layers.0.weight", "momentum_buffer"},
		{"optimizer.state.layers.0.weight.nested.inner", "layers.0.weight", "nested.inner"},
		{"optimizer.state.unknown.param.variance", "unknown.param", "variance"},
	} {
		fqn, slot, ok := sk.Split(c.key)
		assert.True(t, ok, c.key)
		assert.Equal(t, c.fqn, fqn, c.key)
		assert.Equal(t, c.slot, slot, c.key)
	}
	for _, key := range []string{"optimizer.param_groups.0.lr", "model.a", "optimizer.state.a", "optimizer.state.a.", "optimizer.state.noslot"} {
		_, _, ok := sk.Split(key)
		assert.False(t, ok, key)
	}
}

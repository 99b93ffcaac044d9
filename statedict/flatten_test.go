package statedict

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func trainingState() (map[string]any, *Tensor, *Shard, *Tensor) {
	w := NewTensor(Float32, 4, 2)
	for i := range w.Data {
		w.Data[i] = byte(i)
	}
	shard := RowShard(NewTensor(BFloat16, 6, 3), 1, 2)
	step := NewTensor(Float32)
	state := map[string]any{
		"model": map[string]any{
			"layer1": map[string]any{"weight": w, "bias": shard},
		},
		"optimizer": map[string]any{
			"state": map[string]any{
				"layer1": map[string]any{"weight": map[string]any{"step": step}},
			},
			"param_groups": []any{
				map[string]any{"lr": 0.001, "betas": []any{0.9, 0.999}, "amsgrad": false, "name": "decay", "params": []any{int64(0), 1}},
				map[string]any{"lr": 0.01, "weight_decay": nil},
			},
		},
		"scheduler": map[string]any{"last_epoch": 7, "_step_count": 8},
		"iteration": int64(1234),
		"rng":       []byte{0xff, 0x00, 0x7b},
	}
	return state, w, shard, step
}

func TestFlattenKeys(t *testing.T) {
	state, w, shard, step := trainingState()
	sd, err := Flatten(state)
	require.NoError(t, err)
	require.NoError(t, sd.Check())

	assert.Equal(t, []string{
		"iteration",
		"model.layer1.bias",
		"model.layer1.weight",
		"optimizer.param_groups.0.amsgrad",
		"optimizer.param_groups.0.betas.0",
		"optimizer.param_groups.0.betas.1",
		"optimizer.param_groups.0.lr",
		"optimizer.param_groups.0.name",
		"optimizer.param_groups.0.params.0",
		"optimizer.param_groups.0.params.1",
		"optimizer.param_groups.1.lr",
		"optimizer.param_groups.1.weight_decay",
		"optimizer.state.layer1.weight.step",
		"rng",
		"scheduler._step_count",
		"scheduler.last_epoch",
	}, sd.Keys())
	assert.Equal(t, Whole(w), sd.Tensors["model.layer1.weight"])
	assert.Same(t, shard, sd.Tensors["model.layer1.bias"])
	assert.Equal(t, Whole(step), sd.Tensors["optimizer.state.layer1.weight.step"])
	assert.Empty(t, sd.Tensors["optimizer.state.layer1.weight.step"].Offsets, "0-dim tensor")
	assert.Equal(t, "0.001", string(sd.Bytes["optimizer.param_groups.0.lr"]))
	assert.Equal(t, "false", string(sd.Bytes["optimizer.param_groups.0.amsgrad"]))
	assert.Equal(t, `"decay"`, string(sd.Bytes["optimizer.param_groups.0.name"]))
	assert.Equal(t, "null", string(sd.Bytes["optimizer.param_groups.1.weight_decay"]))
	assert.Equal(t, "1234", string(sd.Bytes["iteration"]))
	assert.Equal(t, []byte{0xff, 0x00, 0x7b}, sd.Bytes["rng"])
}

func TestFlattenUnflattenRoundTrip(t *testing.T) {
	state, w, shard, step := trainingState()
	sd, err := Flatten(state)
	require.NoError(t, err)
	got, err := Unflatten(sd)
	require.NoError(t, err)
	want := map[string]any{
		"model": map[string]any{
			"layer1": map[string]any{"weight": Whole(w), "bias": shard},
		},
		"optimizer": map[string]any{
			"state": map[string]any{
				"layer1": map[string]any{"weight": map[string]any{"step": Whole(step)}},
			},
			"param_groups": []any{
				map[string]any{"lr": 0.001, "betas": []any{0.9, 0.999}, "amsgrad": false, "name": "decay", "params": []any{0.0, 1.0}},
				map[string]any{"lr": 0.01, "weight_decay": nil},
			},
		},
		"scheduler": map[string]any{"last_epoch": 7.0, "_step_count": 8.0},
		"iteration": 1234.0,
		"rng":       []byte{0xff, 0x00, 0x7b},
	}
	assert.Equal(t, want, got)

	// And flattening the result again gives the same flat state.
	again, err := Flatten(got)
	require.NoError(t, err)
	assert.Equal(t, sd, again)
}

func TestUnflattenNumericLevels(t *testing.T) {
	sd := New()
	require.NoError(t, sd.PutJSON("sparse.1", "a"))
	require.NoError(t, sd.PutJSON("sparse.2", "b"))
	require.NoError(t, sd.PutJSON("padded.00", 1))
	require.NoError(t, sd.PutJSON("list.1", "y"))
	require.NoError(t, sd.PutJSON("list.0", "x"))
	require.NoError(t, sd.PutJSON("0", "top-level stays a map"))
	got, err := Unflatten(sd)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{
		"sparse": map[string]any{"1": "a", "2": "b"},
		"padded": map[string]any{"00": 1.0},
		"list":   []any{"x", "y"},
		"0":      "top-level stays a map",
	}, got)
}

func TestFlattenErrors(t *testing.T) {
	tests := []struct {
		name  string
		state map[string]any
		want  string
	}{
		{"dotted key", map[string]any{"model": map[string]any{"layer.1": 1}}, `"layer.1"`},
		{"empty key", map[string]any{"": 1}, `""`},
		{"unsupported type", map[string]any{"opt": []any{float32(1)}}, `"opt.0"`},
		{"bad tensor", map[string]any{"w": &Tensor{DType: Float32, Shape: []int64{2}, Data: []byte{1}}}, `"w"`},
		{"nil tensor", map[string]any{"w": (*Tensor)(nil)}, `"w"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Flatten(tc.state)
			require.ErrorIs(t, err, ErrFlatten)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestUnflattenErrors(t *testing.T) {
	sd := New()
	sd.Bytes["a"] = []byte("1")
	sd.Bytes["a.b"] = []byte("2")
	_, err := Unflatten(sd)
	require.ErrorIs(t, err, ErrFlatten)
	assert.Contains(t, err.Error(), `"a`)

	sd = New()
	sd.Bytes["a..b"] = []byte("1")
	_, err = Unflatten(sd)
	require.ErrorIs(t, err, ErrFlatten)
	assert.Contains(t, err.Error(), `"a..b"`)
}

func TestPutGetJSON(t *testing.T) {
	type sched struct {
		LastEpoch int       `json:"last_epoch"`
		BaseLRs   []float64 `json:"base_lrs"`
	}
	sd := New()
	require.NoError(t, sd.PutJSON("scheduler.state", sched{LastEpoch: 3, BaseLRs: []float64{0.1}}))
	require.NoError(t, sd.PutJSON("iteration", 42))
	var s sched
	require.NoError(t, sd.GetJSON("scheduler.state", &s))
	assert.Equal(t, sched{LastEpoch: 3, BaseLRs: []float64{0.1}}, s)
	var it int64
	require.NoError(t, sd.GetJSON("iteration", &it))
	assert.Equal(t, int64(42), it)

	err := sd.GetJSON("scheduler.missing", &s)
	require.ErrorIs(t, err, ErrNoSuchKey)
	assert.Contains(t, err.Error(), `"scheduler.missing"`)

	sd.Tensors["w"] = Whole(NewTensor(Int8, 1))
	require.ErrorIs(t, sd.PutJSON("w", 1), ErrFlatten)
	require.Error(t, sd.PutJSON("x", func() {}))
	err = sd.GetJSON("iteration", &s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"iteration"`)

	var zero StateDict
	require.NoError(t, zero.PutJSON("k", true))
}

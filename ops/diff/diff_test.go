package diff_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/ops/diff"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/statedict"
)

func open(t *testing.T, run *backend.Store, step int64) *loader.Checkpoint {
	t.Helper()
	st, err := run.Sub(catalog.StepName(step))
	require.NoError(t, err)
	c, err := loader.Open(context.Background(), st)
	require.NoError(t, err)
	return c
}

// smooth replaces the float tensors' random bits with finite values.
func smooth(s *ckpttest.State) {
	for _, t := range s.Tensors {
		if t.DType != statedict.Float32 {
			continue
		}
		for i := 0; i < len(t.Data); i += 4 {
			binary.LittleEndian.PutUint32(t.Data[i:], math.Float32bits(float32(i)/7))
		}
	}
}

func clone(s *ckpttest.State) *ckpttest.State {
	c := &ckpttest.State{Tensors: map[string]*statedict.Tensor{}, Bytes: map[string][]byte{}}
	for k, t := range s.Tensors {
		c.Tensors[k] = &statedict.Tensor{DType: t.DType, Shape: t.Shape, Data: append([]byte(nil), t.Data...)}
	}
	for k, b := range s.Bytes {
		c.Bytes[k] = append([]byte(nil), b...)
	}
	return c
}

func TestDiffFindsOneFlippedElement(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			s := ckpttest.NewState(1, 6)
			smooth(s)
			ckpttest.SaveStep(t, run, 1, s, 2)
			ckpttest.SaveStep(t, run, 2, s, 3) // same content, other sharding
			flipped := clone(s)
			w := flipped.Tensors["model.embed.weight"]
			at := 4 * 13
			v := math.Float32frombits(binary.LittleEndian.Uint32(w.Data[at:]))
			binary.LittleEndian.PutUint32(w.Data[at:], math.Float32bits(v+0.25))
			ckpttest.SaveStep(t, run, 3, flipped, 2)

			rep, err := diff.Compare(ctx, open(t, run, 1), open(t, run, 2), diff.Options{})
			require.NoError(t, err)
			assert.True(t, rep.Identical)
			assert.Empty(t, rep.Differences)
			assert.Equal(t, len(s.Keys()), rep.Keys)
			assert.Equal(t, rep.Keys, rep.Compared)

			var seen progress.Update
			rep, err = diff.Compare(ctx, open(t, run, 1), open(t, run, 3), diff.Options{Progress: func(u progress.Update) { seen = u }})
			require.NoError(t, err)
			assert.False(t, rep.Identical)
			assert.Equal(t, int64(rep.Keys), seen.Done)
			assert.Equal(t, int64(rep.Keys), seen.Total)
			assert.Equal(t, progress.Keys, seen.Unit)
			assert.Contains(t, s.Keys(), seen.Item, "Item names the key compared")
			require.Len(t, rep.Differences, 1)
			d := rep.Differences[0]
			assert.Equal(t, "model.embed.weight", d.Key)
			assert.Equal(t, diff.KindContent, d.Kind)
			assert.NotEqual(t, d.SHA256A, d.SHA256B)
			assert.Len(t, d.SHA256A, 64)

			// Tolerance: 0.25 apart.
			rep, err = diff.Compare(ctx, open(t, run, 1), open(t, run, 3), diff.Options{UseTolerance: true, Tolerance: 0.1})
			require.NoError(t, err)
			require.Len(t, rep.Differences, 1)
			assert.InDelta(t, 0.25, *rep.Differences[0].MaxAbsDiff, 1e-6)
			assert.Equal(t, int64(1), rep.Differences[0].Elements)
			rep, err = diff.Compare(ctx, open(t, run, 1), open(t, run, 3), diff.Options{UseTolerance: true, Tolerance: 0.3})
			require.NoError(t, err)
			assert.True(t, rep.Identical)
		})
	}
}

func TestDiffStructuralChanges(t *testing.T) {
	run := ckpttest.Backends(t)[1].Open(t)
	s := ckpttest.NewState(1, 4)
	ckpttest.SaveStep(t, run, 1, s, 1)
	o := clone(s)
	delete(o.Tensors, "model.embed.weight")                                            // missing in B
	o.Tensors["model.new.bias"] = statedict.NewTensor(statedict.Float32, 2)            // extra in B
	o.Tensors["model.layer_int8.weight"] = statedict.NewTensor(statedict.Int16, 4, 3)  // dtype
	o.Tensors["model.layer_int32.weight"] = statedict.NewTensor(statedict.Int32, 3, 4) // shape
	o.Bytes["model.scale"] = []byte("1")                                               // kind
	delete(o.Tensors, "model.scale")
	o.Bytes["scheduler.last_epoch"] = []byte("99") // bytes content
	ckpttest.SaveStep(t, run, 2, o, 1)

	rep, err := diff.Compare(context.Background(), open(t, run, 1), open(t, run, 2), diff.Options{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, d := range rep.Differences {
		got[d.Key] = d.Kind
	}
	assert.Equal(t, map[string]string{
		"model.embed.weight":       diff.KindMissing,
		"model.new.bias":           diff.KindExtra,
		"model.layer_int8.weight":  diff.KindDType,
		"model.layer_int32.weight": diff.KindShape,
		"model.scale":              diff.KindKind,
		"scheduler.last_epoch":     diff.KindContent,
	}, got)
	assert.Equal(t, rep.Keys-5, rep.Compared)
}

func TestHalfToFloat64(t *testing.T) {
	for h, want := range map[uint16]float64{
		0x0000: 0, 0x3c00: 1, 0xc000: -2, 0x7bff: 65504, 0x0001: math.Ldexp(1, -24),
		0x0400: math.Ldexp(1, -14), 0x3555: 0.333251953125, 0x7c00: math.Inf(1), 0xfc00: math.Inf(-1),
	} {
		assert.Equal(t, want, diff.HalfToFloat64(h), "%#04x", h)
	}
	assert.True(t, math.IsNaN(diff.HalfToFloat64(0x7e00)))
}

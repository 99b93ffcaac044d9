package torchdcp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// Issue 30: a DCP checkpoint saved before the first optimizer step (its
// param groups, no optimizer state) failed "no optimizer keys" when loaded
// with the optimizer. Written by torch's FileSystemWriter and by
// ckptkit.torch.save (testdata/gen/gen_step0.py), it records the optimizer
// as saved and loads into a target that asks for AdamW state: every
// parameter lazily absent, its state untouched, the model loaded.
func TestStepZeroCheckpointLoadsWithTheOptimizer(t *testing.T) {
	params := []string{"0.bias", "0.weight", "2.bias", "2.weight"}
	for _, name := range []string{"step0/torch", "step0/ckptkit"} {
		t.Run(name, func(t *testing.T) {
			_, c := openCase(t, name)
			md := c.Metadata()
			require.Equal(t, metadata.OptimizerSaved, md.Training.Optimizer)
			require.Zero(t, md.Training.OptimizerStateEntries)
			rep, err := c.Verify(context.Background(), loader.VerifyOptions{})
			require.NoError(t, err)
			require.True(t, rep.Resumable, "%+v", rep.Problems)
			assert.Equal(t, params, rep.LazyParams)

			target := fullTarget(c)
			for _, fqn := range params {
				w := md.Tensor(statedict.ModelKey("model", fqn))
				require.NotNil(t, w, fqn)
				target.Tensors[statedict.StateKey("optimizer", fqn, statedict.SlotStep)] = statedict.Whole(statedict.NewTensor(statedict.Float32))
				for _, slot := range []string{statedict.SlotExpAvg, statedict.SlotExpAvgSq} {
					target.Tensors[statedict.StateKey("optimizer", fqn, slot)] = statedict.Whole(statedict.NewTensor(statedict.Float32, w.Shape...))
				}
			}
			fill(target, 0xab)
			lr, err := c.Load(context.Background(), []*statedict.StateDict{target}, loader.Options{ParamGroups: [][]string{params}, Logger: quiet()})
			require.NoError(t, err)
			assert.True(t, lr.OptimizerLoaded)
			assert.Equal(t, params, lr.LazyParams)
			for k, sh := range target.Tensors {
				state := strings.HasPrefix(k, "optimizer.state.")
				untouched := true
				for _, b := range sh.Data {
					untouched = untouched && b == 0xab
				}
				assert.Equal(t, state, untouched, "%s: lazy state untouched, model loaded", k)
			}
		})
	}
}

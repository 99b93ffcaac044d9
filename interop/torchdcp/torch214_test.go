package torchdcp_test

// DCP checkpoints torch 2.14.1 wrote itself (testdata/torch2.14, from
// gen/gen_torch214.py: Adafactor, Muon + AdamW merged, SGD momentum, each
// with experts.1 lazily absent, and Adafactor missing one col_var), read
// with no census: the per-parameter rules (the subset rule within each
// param group in verify; each parameter's own target slots in a load)
// accept the valid ones with exactly their lazy parameters and refuse the
// partial one naming only the missing key.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/statedict"
)

// expected214 is a fixture's expected.json (written by the generator).
type expected214 struct {
	Keys []struct {
		Key    string  `json:"key"`
		Kind   string  `json:"kind"`
		DType  string  `json:"dtype"`
		Shape  []int64 `json:"shape"`
		SHA256 string  `json:"sha256"`
	} `json:"keys"`
	LazyParams  []string `json:"lazy_params"`
	MissingKeys []string `json:"missing_keys"`
	Verdict     string   `json:"expected_verdict"`
}

var torch214Cases = []string{"adafactor", "muon_adamw", "sgd_momentum", "sgd_momentum_nocrc", "adafactor_partial"}

func readExpected214(t *testing.T, name string) expected214 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "torch2.14", name, "expected.json"))
	require.NoError(t, err, "the torch 2.14 fixtures are part of the module")
	var e expected214
	require.NoError(t, json.Unmarshal(b, &e))
	require.NotEmpty(t, e.Keys)
	return e
}

// resumingTarget is what a resuming job asks for: every key of the
// checkpoint, plus fresh state for the lazily absent parameters with the
// slots their optimizer gives them (those of their routed sibling in
// experts.0, the same shape and param group).
func resumingTarget(c *loader.Checkpoint, lazy []string) *statedict.StateDict {
	sd := fullTarget(c)
	for _, fqn := range lazy {
		sibling := strings.Replace(fqn, "experts.1.", "experts.0.", 1)
		for _, te := range c.Metadata().Tensors {
			if slot, ok := strings.CutPrefix(te.Key, "optimizer.state."+sibling+"."); ok {
				sd.Tensors["optimizer.state."+fqn+"."+slot] = statedict.Whole(statedict.NewTensor(statedict.DType(te.DType), te.Shape...))
			}
		}
	}
	return sd
}

func TestTorch214Checkpoints(t *testing.T) {
	ctx := context.Background()
	for _, name := range torch214Cases {
		t.Run(name, func(t *testing.T) {
			want := readExpected214(t, name)
			st, c := openCase(t, filepath.Join("torch2.14", name))
			rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
			require.NoError(t, err)
			assert.Equal(t, want.LazyParams, rep.LazyParams, "exactly the lazily absent parameters")
			target := resumingTarget(c, want.LazyParams)
			fill(target, 0x5a)
			before := snapshot(target)
			lr, err := c.Load(ctx, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
			if want.Verdict == "resumable" {
				require.True(t, rep.Resumable, "%+v", rep.Problems)
				require.NoError(t, err)
				assert.Equal(t, want.LazyParams, lr.LazyParams)
				for _, k := range want.Keys {
					if k.Kind != "tensor" {
						continue
					}
					got := sha256.Sum256(target.Tensors[k.Key].Data)
					assert.Equal(t, k.SHA256, hex.EncodeToString(got[:]), "%s as torch saved it", k.Key)
				}
				for _, fqn := range want.LazyParams {
					for k, s := range target.Tensors {
						if strings.HasPrefix(k, "optimizer.state."+fqn+".") {
							assert.Equal(t, before.Tensors[k].Data, s.Data, "%s is left fresh", k)
						}
					}
				}
				return
			}
			// The partial one: refused by verify and by the load, naming
			// only the missing key, before any target byte changes.
			require.False(t, rep.Resumable)
			require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
			require.Equal(t, loader.RulePartialOptimizer, rep.Problems[0].Rule)
			_, lacks, _ := strings.Cut(rep.Problems[0].Message, "lacks ")
			require.Equal(t, want.MissingKeys, []string{strings.Fields(lacks)[0]}, rep.Problems[0].Message)
			require.ErrorIs(t, err, loader.ErrPartialOptimizerState)
			_, lacks, _ = strings.Cut(err.Error(), "lacks ")
			require.Equal(t, strings.Join(want.MissingKeys, ", "), lacks, "only the missing key: %v", err)
			require.Equal(t, before, target, "a refused load leaves the target untouched")
			// A target built from the metadata (asking only for what is
			// there) is refused too: corruption anywhere is refused.
			_, err = c.Load(ctx, []*statedict.StateDict{fullTarget(c)}, loader.Options{Logger: quiet()})
			require.ErrorIs(t, err, loader.ErrPartialOptimizerState)
		})
	}
}

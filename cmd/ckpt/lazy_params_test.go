package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/loader"
)

// torch2Fixture is a PyTorch 2.6 DCP fixture, part of the module
// (interop/torchdcp/testdata/torch2.6); a missing one fails the test.
func torch2Fixture(t *testing.T, name string) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "interop", "torchdcp", "testdata", "torch2.6", name))
	require.NoError(t, err)
	_, err = os.Stat(dir)
	require.NoError(t, err, "the torch 2.6 fixtures are part of the module")
	return dir
}

// TestVerifyLazyParamsAreParameters: verify reports as lazily absent only
// the optimizer's parameters without state, taken from the checkpoint's
// optimizer.param_groups.<i>.params, never registered buffers: none for
// dense2 (whose buffers position_ids, scale_bf16 and shift_f16 have no
// optimizer state by nature), exactly expected.json's four experts.1.*
// parameters for lazy_moe2.
func TestVerifyLazyParamsAreParameters(t *testing.T) {
	for _, name := range []string{"dense2", "lazy_moe2"} {
		t.Run(name, func(t *testing.T) {
			dir := torch2Fixture(t, name)
			raw, err := os.ReadFile(filepath.Join(dir, "expected.json"))
			require.NoError(t, err)
			var exp struct {
				Verdict struct {
					Resumable  bool     `json:"resumable"`
					Iteration  int64    `json:"iteration"`
					LazyParams []string `json:"lazily_absent_params"`
				} `json:"expected_verdict"`
			}
			require.NoError(t, json.Unmarshal(raw, &exp))
			want := append([]string{}, exp.Verdict.LazyParams...)
			sort.Strings(want)

			code, out, errs := ckpt(t, "verify", "--json", dir)
			require.Equal(t, 0, code, "stderr: %s", errs)
			var rep verifyOutput
			require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
			assert.Equal(t, exp.Verdict.Resumable, rep.Resumable)
			assert.Equal(t, exp.Verdict.Iteration, rep.Iteration)
			assert.Equal(t, want, append([]string{}, rep.LazyParams...), "lazily absent parameters")
			for _, f := range rep.Info {
				if len(want) == 0 {
					assert.NotEqual(t, loader.RuleLazyOptimizer, f.Rule, "no lazy-optimizer-state finding: %s", f.Message)
				}
			}

			_, text, _ := ckpt(t, "verify", dir)
			for _, buffer := range []string{"position_ids", "scale_bf16", "shift_f16"} {
				assert.NotContains(t, text, buffer, "a buffer is never reported")
			}
		})
	}
}

package main

// The CLI on DCP checkpoints torch 2.14 wrote itself
// (interop/torchdcp/testdata/torch2.14, one saved without zip CRC-32s):
// verify --deep says resumable with
// exactly the lazily absent parameters, or refuses the partial one naming
// only its missing key; latest finds the newest valid one of a run made of
// them; inspect, diff and convert read them.

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

const torch214 = "../../interop/torchdcp/testdata/torch2.14"

func TestTorch214CheckpointsThroughTheCLI(t *testing.T) {
	lazy := []string{"experts.1.bias", "experts.1.weight"}
	for _, c := range []string{"adafactor", "muon_adamw", "sgd_momentum", "sgd_momentum_nocrc"} {
		code, out, errs := ckpt(t, "verify", "--deep", "--json", filepath.Join(torch214, c))
		require.Equal(t, 0, code, "%s: %s%s", c, out, errs)
		var rep struct {
			Resumable  bool     `json:"resumable"`
			LazyParams []string `json:"lazy_params"`
			NotChecked string   `json:"not_checked"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		require.True(t, rep.Resumable)
		require.Equal(t, lazy, rep.LazyParams, c)
		// Only the checkpoint torch saved with compute_crc32 = False says
		// that its flipped bytes could not be detected.
		if c == "sgd_momentum_nocrc" {
			require.Contains(t, rep.NotChecked, "compute_crc32 = False", c)
		} else {
			require.Empty(t, rep.NotChecked, c)
		}

		code, out, errs = ckpt(t, "inspect", "--json", "--hash", filepath.Join(torch214, c))
		require.Equal(t, 0, code, errs)
		require.Contains(t, out, `"format":"torch-dcp"`)
		code, out, errs = ckpt(t, "diff", filepath.Join(torch214, c), filepath.Join(torch214, c))
		require.Equal(t, 0, code, "%s%s", out, errs)
		native := filepath.Join(t.TempDir(), c)
		code, out, errs = ckpt(t, "convert", filepath.Join(torch214, c), native, "--to", "ckptkit")
		require.Equal(t, 0, code, "%s%s", out, errs)
		code, out, errs = ckpt(t, "verify", "--deep", native)
		require.Equal(t, 0, code, "%s converted: %s%s", c, out, errs)
		code, out, errs = ckpt(t, "diff", filepath.Join(torch214, c), native)
		require.Equal(t, 0, code, "%s converted diffs equal: %s%s", c, out, errs)
	}

	const missing = "optimizer.state.experts.0.weight.col_var"
	code, out, _ := ckpt(t, "verify", "--deep", filepath.Join(torch214, "adafactor_partial"))
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "partial-optimizer-state")
	_, lacks, _ := strings.Cut(out, "lacks ")
	require.True(t, strings.HasPrefix(lacks, missing+" "), "only %s is missing: %s", missing, out)
	require.Equal(t, 1, strings.Count(out, "lacks "), out)

	// A run of them, the partial one newest: latest skips it, naming why.
	run := filepath.Join(t.TempDir(), "run")
	for i, c := range []string{"sgd_momentum", "muon_adamw", "adafactor", "adafactor_partial"} {
		ckpttest.CopyDir(t, filepath.Join(torch214, c), filepath.Join(run, "step-0000000"+string(rune('1'+i))))
	}
	code, out, errs := ckpt(t, "latest", "--json", run)
	require.Equal(t, 0, code, "%s%s", out, errs)
	var found struct {
		Checkpoint struct{ Name string }           `json:"checkpoint"`
		Skipped    []struct{ Name, Reason string } `json:"skipped"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &found))
	require.Equal(t, "step-00000003", found.Checkpoint.Name)
	require.Len(t, found.Skipped, 1)
	require.Equal(t, "step-00000004", found.Skipped[0].Name)
	require.Contains(t, found.Skipped[0].Reason, missing)
}

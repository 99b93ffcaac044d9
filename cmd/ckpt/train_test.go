package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/metadata"
)

// ckpt runs the command line in-process and returns exit code and output.
func ckpt(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func trainJSON(t *testing.T, args ...string) trainResult {
	t.Helper()
	code, out, errs := ckpt(t, append([]string{"train", "--json", "--seed", "7"}, args...)...)
	require.Equal(t, 0, code, "train %v failed: %s", args, errs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res trainResult
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "last line must be one JSON object: %q", out)
	return res
}

func TestTrainResumeIsBitIdentical(t *testing.T) {
	dir := t.TempDir()
	straight := trainJSON(t, "--url", filepath.Join(dir, "straight"), "--steps", "12", "--save-every", "3")
	require.Equal(t, int64(12), straight.Step)
	require.Nil(t, straight.ResumedFrom)
	require.Len(t, straight.WeightsSHA256, 64)

	// 6 steps, then resume to 12: the step-6 checkpoint lacks the unrouted
	// expert's optimizer state, which the resume prunes and reports.
	split := filepath.Join(dir, "split")
	trainJSON(t, "--url", split, "--steps", "6", "--save-every", "3")
	resumed := trainJSON(t, "--url", split, "--steps", "12", "--save-every", "3", "--resume")
	require.NotNil(t, resumed.ResumedFrom)
	require.Equal(t, int64(6), *resumed.ResumedFrom)
	require.Equal(t, 6, resumed.PrunedOptimizerKeys, "expert 1 weight+bias x 3 slots are lazily absent at step 6")
	require.Equal(t, straight.WeightsSHA256, resumed.WeightsSHA256)
	require.Equal(t, straight.LR, resumed.LR)

	// Saved with 4 ranks, resumed with 2.
	resh := filepath.Join(dir, "reshard")
	trainJSON(t, "--url", resh, "--steps", "6", "--save-every", "3", "--ranks", "4")
	r2 := trainJSON(t, "--url", resh, "--steps", "12", "--save-every", "3", "--ranks", "2", "--resume")
	require.Equal(t, straight.WeightsSHA256, r2.WeightsSHA256)

	// Step 3 and 6 checkpoints verify although they lack expert 1's state.
	for _, step := range []string{"step-00000003", "step-00000006"} {
		code, out, _ := ckpt(t, "verify", filepath.Join(split, step))
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "lazy-optimizer-state")
	}
}

func TestTrainWithoutOptimizerKeepsSchedule(t *testing.T) {
	dir := t.TempDir()
	straight := trainJSON(t, "--url", filepath.Join(dir, "a"), "--steps", "12", "--save-every", "3")
	run := filepath.Join(dir, "b")
	trainJSON(t, "--url", run, "--steps", "6", "--save-every", "3", "--no-save-optim")
	res := trainJSON(t, "--url", run, "--steps", "12", "--save-every", "3", "--resume")
	require.Equal(t, int64(6), *res.ResumedFrom, "iteration restored")
	require.Equal(t, straight.LR, res.LR, "LR schedule restored, not restarted")
	require.False(t, res.OptimizerLoaded)
	require.NotEqual(t, straight.WeightsSHA256, res.WeightsSHA256, "optimizer restarted fresh, so weights differ")

	// --no-load-optim is the mirror on load.
	run2 := filepath.Join(dir, "c")
	trainJSON(t, "--url", run2, "--steps", "6", "--save-every", "3")
	res2 := trainJSON(t, "--url", run2, "--steps", "12", "--save-every", "3", "--resume", "--no-load-optim")
	require.Equal(t, int64(6), *res2.ResumedFrom)
	require.Equal(t, straight.LR, res2.LR)
	require.False(t, res2.OptimizerLoaded)
}

func TestVerifyRejectsPartialOptimizerState(t *testing.T) {
	dir := t.TempDir()
	trainJSON(t, "--url", dir, "--steps", "9", "--save-every", "9")
	ckptDir := filepath.Join(dir, "step-00000009")
	ctx := context.Background()
	st, err := backend.Open(ctx, ckptDir)
	require.NoError(t, err)
	raw, err := st.ReadAll(ctx, metadata.ObjectKey, 0)
	require.NoError(t, err)
	md, err := metadata.Decode(raw)
	require.NoError(t, err)
	removed := ""
	for i, e := range md.Tensors {
		if strings.HasSuffix(e.Key, ".exp_avg_sq") {
			removed = e.Key
			md.Tensors = append(md.Tensors[:i], md.Tensors[i+1:]...)
			break
		}
	}
	require.NotEmpty(t, removed)
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, enc, backend.PutOptions{}))

	code, out, _ := ckpt(t, "verify", "--json", ckptDir)
	require.Equal(t, 1, code)
	require.Contains(t, out, "partial-optimizer-state")
	require.Contains(t, out, removed)

	// Resume refuses to start over when the only committed checkpoint is bad.
	code, _, errs := ckpt(t, "train", "--url", dir, "--steps", "12", "--resume")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "partial-optimizer-state")
}

func TestExitCodes(t *testing.T) {
	code, _, errs := ckpt(t, "inspect", "nosuchscheme://x")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "registered schemes")
	code, _, errs = ckpt(t, "verify", "mem://empty-verify")
	require.Equal(t, 3, code, "nothing stored there: not found, not a bad checkpoint")
	require.Contains(t, errs, "no such path: mem://empty-verify")
	code, _, _ = ckpt(t, "train", "--bogus-flag")
	require.Equal(t, 2, code)
}

// Regression (review): copying a corrupt or missing checkpoint exited 2
// (usage/access) instead of 1 (bad checkpoint) or 3 (not found).
func TestCopyOfABadCheckpointExitsOne(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := ckpt(t, "copy", filepath.Join(dir, "nothing-here"), "mem://copy-dst/x")
	require.Equal(t, 3, code, "a missing source is not found: %s", errs)
	trainJSON(t, "--url", filepath.Join(dir, "run"), "--steps", "3", "--save-every", "3")
	src := filepath.Join(dir, "run", "step-00000003")
	obj := dataObject(t, src, 0)
	data, err := os.ReadFile(obj)
	require.NoError(t, err)
	data[100] ^= 0xff
	require.NoError(t, os.WriteFile(obj, data, 0o644))
	code, _, errs = ckpt(t, "copy", src, "mem://copy-dst/y")
	require.Equal(t, 1, code, errs)
	require.Contains(t, errs, "checksum mismatch")
	require.Equal(t, 1, strings.Count(errs, "checksum mismatch"), "the cause is said once: %s", errs)
}

// dataObject returns the path of rank's first data object in the fs
// checkpoint dir (its name carries the save attempt's id).
func dataObject(t *testing.T, dir string, rank int) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("rank-%05d-000.*.data", rank)))
	require.NoError(t, err)
	require.Len(t, m, 1, "one data object of rank %d in %s", rank, dir)
	return m[0]
}

// Regression (issue 15): the default load fills the targets in one pass, so
// a corrupt byte in the newest checkpoint is found midway; --resume then
// says so, falls back to the next older valid checkpoint, and the run ends
// bit-identical to an uninterrupted one.
func TestTrainResumeFallsBackPastCorruptCheckpoint(t *testing.T) {
	dir := t.TempDir()
	straight := trainJSON(t, "--url", filepath.Join(dir, "straight"), "--steps", "12", "--save-every", "3", "--ranks", "2")

	run := filepath.Join(dir, "run")
	trainJSON(t, "--url", run, "--steps", "9", "--save-every", "3", "--ranks", "2")
	// Flip one byte of the newest checkpoint's last data chunk: its
	// metadata still verifies, only reading the bytes finds it.
	ctx := context.Background()
	st, err := backend.Open(ctx, filepath.Join(run, "step-00000009"))
	require.NoError(t, err)
	raw, err := st.ReadAll(ctx, metadata.ObjectKey, 0)
	require.NoError(t, err)
	md, err := metadata.Decode(raw)
	require.NoError(t, err)
	last := md.Tensors[len(md.Tensors)-1]
	ch := last.Chunks[len(last.Chunks)-1]
	obj := filepath.Join(run, "step-00000009", filepath.FromSlash(ch.Object))
	data, err := os.ReadFile(obj)
	require.NoError(t, err)
	data[ch.Offset] ^= 0x10
	require.NoError(t, os.WriteFile(obj, data, 0o644))

	code, out, errs := ckpt(t, "train", "--seed", "7", "--url", run, "--steps", "12", "--save-every", "3", "--ranks", "2", "--resume")
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "step-00000009 is damaged")
	require.Contains(t, errs, "checksum mismatch")
	require.Contains(t, errs, "falling back to the next older valid checkpoint")
	require.Regexp(t, `resumed from \S+/run/step-00000006 at step 6`, errs)
	require.Contains(t, out, "weights_sha256 "+straight.WeightsSHA256)

	// With every checkpoint damaged the resume fails as a bad checkpoint
	// instead of starting over.
	bad := filepath.Join(dir, "bad")
	trainJSON(t, "--url", bad, "--steps", "3", "--save-every", "3", "--ranks", "2")
	obj = dataObject(t, filepath.Join(bad, "step-00000003"), 0) // names carry the save attempt: not step 9's
	data, err = os.ReadFile(obj)
	require.NoError(t, err)
	data[0] ^= 0x10
	require.NoError(t, os.WriteFile(obj, data, 0o644))
	code, _, errs = ckpt(t, "train", "--url", bad, "--steps", "6", "--save-every", "3", "--ranks", "2", "--resume")
	require.Equal(t, 1, code, errs)
	require.Contains(t, errs, "no older checkpoint is valid")
}

// --resume of a URL under which nothing is stored (a typo) exits 3 and
// starts nothing; with --allow-fresh it starts a new run from step 0 and
// says so.
func TestResumeOfNothingNeedsAllowFresh(t *testing.T) {
	run := filepath.Join(t.TempDir(), "runn")
	code, out, errs := ckpt(t, "train", "--url", run, "--steps", "3", "--save-every", "3", "--resume")
	require.Equal(t, 3, code, "%s%s", out, errs)
	require.Contains(t, errs, "no such path")
	require.Contains(t, errs, "--allow-fresh")
	_, err := os.Stat(run)
	require.True(t, os.IsNotExist(err), "nothing was written")

	code, out, errs = ckpt(t, "train", "--url", run, "--steps", "3", "--save-every", "3", "--resume", "--allow-fresh")
	require.Equal(t, 0, code, "%s%s", out, errs)
	require.Contains(t, errs, "fresh start")
	require.FileExists(t, filepath.Join(run, "step-00000003", "ckptkit.metadata.json"))
}

// --resume of a run whose committed checkpoints all fail to open is
// refused (exit 1, run.RefusedError, naming the newest), never a fresh
// start; latest and inspect refuse it alike.
func TestResumeRefusesARunWithNoValidCheckpoint(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, "--url", run, "--steps", "6", "--save-every", "3")
	for _, s := range []string{"step-00000003", "step-00000006"} {
		require.NoError(t, os.WriteFile(filepath.Join(run, s, metadata.ObjectKey), []byte("{not json"), 0o644))
	}
	for _, args := range [][]string{
		{"train", "--url", run, "--steps", "9", "--save-every", "3", "--resume", "--allow-fresh"},
		{"latest", run},
		{"inspect", run},
	} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, 1, code, "%v: %s%s", args, out, errs)
		require.Contains(t, errs, "every committed checkpoint failed verification", args)
		require.Contains(t, errs, "step-00000006", args)
	}
	_, err := os.Stat(filepath.Join(run, "step-00000009"))
	require.True(t, os.IsNotExist(err), "nothing was trained")
}

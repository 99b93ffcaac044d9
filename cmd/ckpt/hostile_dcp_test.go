package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// Regression (issue 16): a real DCP checkpoint whose optimizer parameter
// list item names a forbidden global was "OK: resumable" (the decode error
// was swallowed). verify, shallow and deep, now exits with the
// bad-checkpoint code and names the item and the global.
func TestVerifyRefusesAForbiddenGlobalInADCPParamsItem(t *testing.T) {
	doc := readmeExitCodes(t)
	dir := filepath.Join(t.TempDir(), "dcp")
	ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", dir)
	ckpttest.PlantForbiddenGlobal(t, dir, "optimizer.param_groups.0.params")
	for _, args := range [][]string{{"verify", dir}, {"verify", "--deep", dir}, {"inspect", dir}} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, doc["bad-checkpoint"], code, "%v: %s%s", args, out, errs)
		assert.Contains(t, errs, "posix.system", args)
		assert.Contains(t, errs, "optimizer.param_groups.0.params", args)
		assert.NotContains(t, out, "resumable", args)
	}
}

// Issue 29: a forbidden global in any bytes item, not only those the
// training state is read from, makes verify (shallow and deep), latest
// (deep) and copy exit with the bad-checkpoint code naming the item and
// the global; copy commits nothing.
func TestEveryCommandRefusesAForbiddenGlobalInAnyDCPBytesItem(t *testing.T) {
	const key = "optimizer.param_groups.0.lr"
	doc := readmeExitCodes(t)
	run := filepath.Join(t.TempDir(), "run")
	dir := filepath.Join(run, "step-00000001")
	ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", dir)
	ckpttest.PlantForbiddenGlobal(t, dir, key)
	dst := filepath.Join(t.TempDir(), "copy")
	for _, args := range [][]string{{"verify", dir}, {"verify", "--deep", dir}, {"latest", "--deep", run}, {"copy", dir, dst}} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, doc["bad-checkpoint"], code, "%v: %s%s", args, out, errs)
		assert.Contains(t, errs, "posix.system", args)
		assert.Contains(t, errs, key, args)
	}
	assert.NoFileExists(t, filepath.Join(dst, ".metadata"))
}

// Issue 29: latest passes over a committed checkpoint whose open fails as a
// bad checkpoint (here a forbidden global in a bytes item) for the next
// older one that verifies, naming the skipped one's key and global.
func TestLatestFallsBackPastAForbiddenGlobal(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", filepath.Join(run, "step-00000001"))
	bad := filepath.Join(run, "step-00000002")
	ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", bad)
	ckpttest.PlantForbiddenGlobal(t, bad, "optimizer.param_groups.0.lr")
	for _, args := range [][]string{{"latest", run}, {"latest", "--deep", run}} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, 0, code, "%v: %s%s", args, out, errs)
		assert.Contains(t, out, "step-00000001", args)
		assert.Contains(t, errs, "step-00000002", args)
		assert.Contains(t, errs, "posix.system", args)
		assert.Contains(t, errs, "optimizer.param_groups.0.lr", args)
	}
}

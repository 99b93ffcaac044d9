package main

// ckpt copy of DCP checkpoints written by ckptkit.torch.save (fixture
// interop/torchdcp/testdata/ckptkit_run, made by its gen script): every
// item is checked against the integrity object's CRC32C on every backend,
// so a flipped byte commits nothing at the destination; a DCP checkpoint
// written by torch itself (no integrity object) is copied with a warning,
// or refused with --require-checksums.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// ctSaveRun is the fixture run of ckptkit.torch.save checkpoints.
const ctSaveRun = "../../interop/torchdcp/testdata/ckptkit_run"

// corruptCtSave copies the fixture's step-00000006 into a temporary
// directory and flips one byte in the middle of its data object; it
// returns the directory and the data object's name.
func corruptCtSave(t *testing.T) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "step-00000006")
	ckpttest.CopyDir(t, filepath.Join(ctSaveRun, "step-00000006"), dir)
	matches, err := filepath.Glob(filepath.Join(dir, "__0_0.*.distcp"))
	require.NoError(t, err)
	require.Len(t, matches, 1)
	b, err := os.ReadFile(matches[0])
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, os.WriteFile(matches[0], b, 0o644))
	return dir, filepath.Base(matches[0])
}

// requireNothingAt fails unless the prefix u holds no object at all.
func requireNothingAt(t *testing.T, u string) {
	t.Helper()
	st := ckpttest.OpenURL(t, u)
	var keys []string
	require.NoError(t, st.List(context.Background(), "", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}))
	require.Empty(t, keys, "a refused copy leaves nothing at %s", u)
}

func TestCopyRefusesACorruptCtSaveCheckpoint(t *testing.T) {
	src, object := corruptCtSave(t)
	code, out, _ := ckpt(t, "verify", "--deep", src)
	require.Equal(t, 1, code, out)

	dsts := []string{filepath.Join(t.TempDir(), "dst")}
	if os.Getenv("CKPTKIT_TEST_S3_URL") != "" || os.Getenv("CI") == "true" {
		dsts = append(dsts, cloudURL(t, "CKPTKIT_TEST_S3_URL"))
	}
	for _, dst := range dsts {
		code, _, errs := ckpt(t, "copy", src, dst)
		require.Equal(t, 1, code, "copy of a corrupt ckptkit.torch.save checkpoint to %s: %s", dst, errs)
		require.Contains(t, errs, "checksum mismatch")
		require.Contains(t, errs, object)
		requireNothingAt(t, dst)
	}
}

// The corrupt checkpoint stored on S3 is refused as a source too.
func TestCopyRefusesACorruptCtSaveCheckpointOnS3(t *testing.T) {
	s3 := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	src, _ := corruptCtSave(t)
	st := ckpttest.OpenURL(t, s3)
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, st.PutBytes(context.Background(), e.Name(), b, backend.PutOptions{}))
	}
	dst := filepath.Join(t.TempDir(), "dst")
	code, _, errs := ckpt(t, "copy", s3, dst)
	require.Equal(t, 1, code, errs)
	require.Contains(t, errs, "checksum mismatch")
	_, err = os.Stat(filepath.Join(dst, ".metadata"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestCopyOfAnIntactCtSaveCheckpointIsChecked(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dst")
	code, out, errs := ckpt(t, "copy", "--json", "--require-checksums", filepath.Join(ctSaveRun, "step-00000006"), dst)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, `"unchecked":false`)
	require.NotContains(t, errs, "warning")
	names, err := os.ReadDir(dst)
	require.NoError(t, err)
	require.Len(t, names, 3, "the .metadata, the data object and the integrity object")
	code, out, _ = ckpt(t, "verify", "--deep", dst)
	require.Equal(t, 0, code, out)
}

// A DCP checkpoint written by torch itself recorded no checksums: copied
// with a warning, refused with --require-checksums.
func TestCopyOfATorchWrittenDCPCheckpointWarnsItIsUnchecked(t *testing.T) {
	src := "../../interop/torchdcp/testdata/dense"
	dst := filepath.Join(t.TempDir(), "dst")
	code, _, errs := ckpt(t, "copy", "--require-checksums", src, dst)
	require.Equal(t, 1, code, errs)
	require.Contains(t, errs, "recorded no checksums")
	requireNothingAt(t, dst)

	code, out, errs := ckpt(t, "copy", "--json", src, dst)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, `"unchecked":true`)
	require.Contains(t, errs, "warning: copied")
	require.True(t, strings.Contains(errs, "no data byte could be checked"), errs)
}

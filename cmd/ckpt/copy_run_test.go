package main

// ckpt copy of a whole run: each committed checkpoint that verifies is
// copied (data checked against its CRC32Cs on the way), the others are
// skipped and named: uncommitted, corrupt bytes found while copying,
// already at the destination.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

type copyRunDoc struct {
	Format      string `json:"format"`
	Checkpoints []struct {
		Name string `json:"name"`
	} `json:"checkpoints"`
	Skipped []struct {
		Name, Reason string
	} `json:"skipped"`
}

func names(cs []struct {
	Name string `json:"name"`
}) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func TestCopyARun(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	trainJSON(t, run, "--steps", "9", "--save-every", "3")
	// Step 6's data is corrupt (its metadata still checks out: only the
	// copy's CRC32C check finds it); step 12 was never committed.
	data := dataObject(t, filepath.Join(run, "step-00000006"), 0)
	b, err := os.ReadFile(data)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x10
	require.NoError(t, os.WriteFile(data, b, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(run, "step-00000012"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(run, "step-00000012", "rank-00000-000.data"), []byte("partial"), 0o644))

	dsts := []string{filepath.Join(dir, "backup")}
	if os.Getenv("CKPTKIT_TEST_S3_URL") != "" || os.Getenv("CI") == "true" {
		dsts = append(dsts, cloudURL(t, "CKPTKIT_TEST_S3_URL"))
	}
	for _, dst := range dsts {
		code, out, errs := ckpt(t, "copy", "--json", run, dst)
		require.Equal(t, 0, code, "%s%s", out, errs)
		validDocument(t, out)
		var doc copyRunDoc
		require.NoError(t, json.Unmarshal([]byte(out), &doc))
		require.Equal(t, "run", doc.Format)
		require.Equal(t, []string{"step-00000003", "step-00000009"}, names(doc.Checkpoints))
		require.Len(t, doc.Skipped, 2, out)
		require.Equal(t, "step-00000006", doc.Skipped[0].Name)
		require.Contains(t, doc.Skipped[0].Reason, "checksum")
		require.Equal(t, "step-00000012", doc.Skipped[1].Name)
		require.Equal(t, "uncommitted", doc.Skipped[1].Reason)
		for _, step := range []string{"step-00000003", "step-00000009"} {
			code, out, errs = ckpt(t, "verify", "--deep", ckpttest.WithPath(dst, step))
			require.Equal(t, 0, code, "%s%s", out, errs)
		}
		code, _, _ = ckpt(t, "verify", ckpttest.WithPath(dst, "step-00000006"))
		require.Equal(t, 3, code, "nothing of the corrupt checkpoint is at the destination")

		// Again: everything valid is already there; nothing is replaced.
		code, out, errs = ckpt(t, "copy", "--json", run, dst)
		require.Equal(t, 0, code, "%s%s", out, errs)
		doc = copyRunDoc{}
		require.NoError(t, json.Unmarshal([]byte(out), &doc))
		require.NotNil(t, doc.Checkpoints, "a run copy lists its checkpoints, none: %s", out)
		require.Empty(t, doc.Checkpoints)
		require.Len(t, doc.Skipped, 4)
	}

	// A run with nothing valid: exit 1, every checkpoint named.
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.MkdirAll(filepath.Join(bad, "step-00000001"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bad, "step-00000001", "rank-00000-000.data"), []byte("x"), 0o644))
	code, out, errs := ckpt(t, "copy", bad, filepath.Join(dir, "bad-copy"))
	require.Equal(t, 1, code, "%s%s", out, errs)
	require.Contains(t, errs, "step-00000001: uncommitted")
}

package main

// ckpt gc and ls on a run of DCP checkpoints written by ckptkit.torch.save
// (fixture ckptkit_run: steps 2, 4, 6, 8 committed, step 8 with the objects
// of a second, abandoned save next to the committed one, step 10 never
// committed), on the filesystem and on S3: the objects are ckptkit's (the
// save tag in their names), so gc expires the old checkpoints by the same
// policy as native ones and removes the abandoned save's objects, and what
// it keeps still verifies.

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// uploadRun writes every file of the fixture run dir to the store at u,
// each step's metadata objects last, as a save commits.
func uploadRun(t *testing.T, dir, u string) {
	t.Helper()
	st := ckpttest.OpenURL(t, u)
	var data, meta []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(rel, "/.metadata") {
			meta = append(meta, rel)
		} else {
			data = append(data, rel)
		}
		return nil
	}))
	for _, rel := range append(data, meta...) {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		require.NoError(t, err)
		require.NoError(t, st.PutBytes(context.Background(), filepath.ToSlash(rel), b, backend.PutOptions{}))
	}
}

func runKeys(t *testing.T, u string) []string {
	t.Helper()
	var keys []string
	require.NoError(t, ckpttest.OpenURL(t, u).List(context.Background(), "", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}))
	sort.Strings(keys)
	return keys
}

func TestGCExpiresCtSaveCheckpoints(t *testing.T) {
	runs := []string{filepath.Join(t.TempDir(), "run")}
	if os.Getenv("CKPTKIT_TEST_S3_URL") != "" || os.Getenv("CI") == "true" {
		runs = append(runs, cloudURL(t, "CKPTKIT_TEST_S3_URL"))
	}
	for _, run := range runs {
		uploadRun(t, ctSaveRun, run)

		code, out, errs := ckpt(t, "ls", "--json", run)
		require.Equal(t, 0, code, errs)
		var ls struct {
			Checkpoints []struct {
				Name           string `json:"name"`
				ForeignObjects int    `json:"foreign_objects"`
			} `json:"checkpoints"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &ls))
		require.Len(t, ls.Checkpoints, 5, out)
		for _, c := range ls.Checkpoints {
			require.Zero(t, c.ForeignObjects, "%s: ckptkit.torch.save wrote every object of %s", run, c.Name)
		}

		code, out, errs = ckpt(t, "gc", "--json", run, "--keep-last", "2", "--grace", "0s")
		require.Equal(t, 0, code, "%s\n%s", out, errs)
		keys := runKeys(t, run)
		var steps []string
		for _, k := range keys {
			step, _, _ := strings.Cut(k, "/")
			if len(steps) == 0 || steps[len(steps)-1] != step {
				steps = append(steps, step)
			}
		}
		require.Equal(t, []string{"step-00000006", "step-00000008"}, steps, "%s: the 2 newest committed are kept, the older and the uncommitted go: %v", run, keys)
		var step8 []string
		for _, k := range keys {
			if rest, ok := strings.CutPrefix(k, "step-00000008/"); ok {
				step8 = append(step8, rest)
			}
		}
		require.Len(t, step8, 3, "%s: the abandoned save's objects of step 8 are deleted: %v", run, step8)
		for _, step := range steps {
			code, out, errs = ckpt(t, "verify", "--deep", ckpttest.WithPath(run, step))
			require.Equal(t, 0, code, "%s %s: %s%s", run, step, out, errs)
		}
	}
}

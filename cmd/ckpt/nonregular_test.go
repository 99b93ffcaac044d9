package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

// ckptWithin runs ckpt and fails the test when it takes longer than d (a
// FIFO at an object key used to hang inspect and verify forever).
func ckptWithin(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errs := ckpt(t, args...)
		done <- result{code, out, errs}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.errs
	case <-time.After(d):
		t.Fatalf("ckpt %v did not return within %s", args, d)
		return 0, "", ""
	}
}

// Regression (issue 16): a FIFO, a directory holding files, or a symbolic
// link out of the root at the newest checkpoint's metadata key made
// inspect/verify hang (FIFO) and train --resume take the checkpoint for
// uncommitted and silently train from step 0. Each is now an error naming
// the key: resume stops instead of starting over.
func TestNonRegularMetadataIsAnErrorNotUncommitted(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret.json")
	require.NoError(t, os.WriteFile(outside, []byte("{}"), 0o644))
	for name, replace := range map[string]func(t *testing.T, md string){
		"fifo": func(t *testing.T, md string) { require.NoError(t, syscall.Mkfifo(md, 0o644)) },
		"directory": func(t *testing.T, md string) {
			require.NoError(t, os.MkdirAll(md, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(md, "x"), []byte("x"), 0o644))
		},
		"escaping symlink": func(t *testing.T, md string) { require.NoError(t, os.Symlink(outside, md)) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			trainJSON(t, "--url", dir, "--steps", "3", "--save-every", "3")
			ck := filepath.Join(dir, "step-00000003")
			md := filepath.Join(ck, metadata.ObjectKey)
			require.NoError(t, os.Remove(md))
			replace(t, md)
			for _, args := range [][]string{{"verify", ck}, {"inspect", ck}, {"train", "--url", dir, "--steps", "6", "--save-every", "3", "--resume"}} {
				code, out, errs := ckptWithin(t, 10*time.Second, args...)
				require.NotEqual(t, 0, code, "%v: %s%s", args, out, errs)
				require.NotContains(t, out+errs, "starting from step 0", "%v", args)
				require.Contains(t, out+errs, metadata.ObjectKey, "%v: the message names the key", args)
			}
		})
	}
}

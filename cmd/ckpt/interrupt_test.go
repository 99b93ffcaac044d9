package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// buildCkpt builds the ckpt binary into a temporary directory.
func buildCkpt(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ckpt")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// bigCheckpoint saves a checkpoint of ranks data objects of mib MiB each
// (one float32 tensor, row-sharded) in a local directory.
func bigCheckpoint(t *testing.T, ranks, mib int) string {
	t.Helper()
	dir := t.TempDir()
	st, err := backend.Open(context.Background(), dir)
	require.NoError(t, err)
	defer st.Close()
	rows := int64(ranks * mib * 256) // 4 KiB rows
	w := statedict.NewTensor(statedict.Float32, rows, 1024)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(w.Data)
	sds := make([]*statedict.StateDict, ranks)
	for r := range sds {
		sds[r] = statedict.New()
		sds[r].Tensors["model.w"] = statedict.RowShard(w, r, ranks)
	}
	_, err = saver.SaveLocal(context.Background(), st, sds, saver.Options{Iteration: 1})
	require.NoError(t, err)
	return dir
}

// An interrupted `ckpt copy` to S3 or GCS aborts its multipart uploads
// (S3) or cancels its resumable sessions and removes their markers (GCS),
// removes what it copied, says how far it got and exits 130 (SIGINT) or
// 143 (SIGTERM): the real binary, signalled mid-upload. A second signal
// exits at once.
//
// Regression (issue 16) on GCS: an interrupted copy only stopped sending;
// its sessions stayed open for a week and nothing recorded them.
func TestInterruptedCopyLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and copies 256 MiB")
	}
	bin := buildCkpt(t)
	for _, srv := range []struct {
		name, env, params string
		ranks, mib        int
	}{
		{"S3", "CKPTKIT_TEST_S3_URL", "&part_size=5MiB&multipart_threshold=5MiB&concurrency=2", 4, 64},
		// The emulator keeps cancelled sessions' bytes in memory: less data.
		{"GCS", "CKPTKIT_TEST_GCS_URL", "?chunk_size=256KiB", 4, 16},
	} {
		t.Run(srv.name, func(t *testing.T) {
			base := cloudURL(t, srv.env)
			src := bigCheckpoint(t, srv.ranks, srv.mib)
			for _, tc := range []struct {
				sig  syscall.Signal
				name string
				code int
			}{{syscall.SIGINT, "SIGINT", 130}, {syscall.SIGTERM, "SIGTERM", 143}} {
				t.Run(tc.name, func(t *testing.T) {
					dstURL := ckpttest.WithPath(base, "copy-"+tc.name) + srv.params
					dst, err := backend.Open(context.Background(), dstURL)
					require.NoError(t, err)
					defer dst.Close()

					cmd, stderr, exited := copyMidUpload(t, bin, src, dstURL, dst)
					require.NoError(t, cmd.Process.Signal(tc.sig))
					var err2 error
					select {
					case err2 = <-exited:
					case <-time.After(60 * time.Second):
						_ = cmd.Process.Kill()
						t.Fatalf("copy did not stop within 60s of %s\n%s", tc.name, stderr.String())
					}
					var ee *exec.ExitError
					require.True(t, errors.As(err2, &ee), "exit: %v\n%s", err2, stderr.String())
					assert.Equal(t, tc.code, ee.ExitCode(), stderr.String())
					msg := stderr.String()
					assert.Contains(t, msg, "stopped after")
					assert.Contains(t, msg, fmt.Sprintf("of %d data objects", srv.ranks))
					assert.Contains(t, msg, "the destination has no committed checkpoint")
					assert.Contains(t, msg, "interrupted by "+tc.name)

					assert.Empty(t, uploads(t, dst), "incomplete uploads under the destination")
					var objects []string
					require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error {
						objects = append(objects, o.Key)
						return nil
					}))
					assert.Empty(t, objects, "objects at the destination (no metadata, no data)")
					t.Logf("%s: %s", tc.name, msg)
				})
			}
			if srv.name == "S3" {
				t.Run("second SIGINT", func(t *testing.T) { secondSignalExitsAtOnce(t, bin, src, base) })
			}
		})
	}
}

// secondSignalExitsAtOnce: a second signal exits at once, with the same
// code, saying so.
func secondSignalExitsAtOnce(t *testing.T, bin, src, base string) {
	dstURL := ckpttest.WithPath(base, "copy-twice") + "&part_size=5MiB&multipart_threshold=5MiB&concurrency=2"
	dst, err := backend.Open(context.Background(), dstURL)
	require.NoError(t, err)
	defer dst.Close()
	drv := dst.Driver().(*s3.Driver)
	t.Cleanup(func() { // the second signal may leave an upload behind
		ctx := context.Background()
		for u := range drv.Client().ListIncompleteUploads(ctx, drv.Bucket(), dst.Prefix(), true) {
			_ = drv.Client().RemoveIncompleteUpload(ctx, drv.Bucket(), u.Key)
		}
		_ = dst.List(ctx, "", func(o backend.ObjectInfo) error { return dst.Delete(ctx, o.Key) })
	})

	cmd, stderr, exited := copyMidUpload(t, bin, src, dstURL, dst)
	deadline := time.Now().Add(30 * time.Second)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	// The second signal once the first is being handled (two pending
	// signals of one kind are delivered as one).
	for !stderr.Contains("stopping") {
		require.True(t, time.Now().Before(deadline), "the first signal was not acknowledged")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("no exit after two signals\n%s", stderr.String())
	}
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit: %v\n%s", err, stderr.String())
	assert.Equal(t, 130, ee.ExitCode(), stderr.String())
	assert.Contains(t, stderr.String(), "second SIGINT: exiting at once")
}

// copyMidUpload starts `ckpt copy src dst` and returns once an incomplete
// upload of it is listed under dst, with the process, its stderr and a
// channel that receives its Wait result.
func copyMidUpload(t *testing.T, bin, src, dstURL string, dst *backend.Store) (*exec.Cmd, *ckpttest.SyncBuffer, chan error) {
	t.Helper()
	stderr := &ckpttest.SyncBuffer{}
	cmd := exec.Command(bin, "copy", "--parallel", "2", src, dstURL)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for len(uploads(t, dst)) == 0 {
		select {
		case err := <-exited:
			t.Fatalf("copy ended before any incomplete upload was seen: %v\n%s", err, stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "no upload started")
		time.Sleep(5 * time.Millisecond)
	}
	return cmd, stderr, exited
}

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
	"github.com/ckptkit/ckptkit/internal/ckpttest"
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

// An interrupted `ckpt copy` to S3 aborts its multipart uploads, removes
// what it copied, says how far it got and exits 130 (SIGINT) or 143
// (SIGTERM): the real binary, signalled mid-upload. A second signal exits
// at once.
func TestInterruptedCopyLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and copies 256 MiB")
	}
	base := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	bin := buildCkpt(t)
	src := bigCheckpoint(t, 4, 64)
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
		code int
	}{{syscall.SIGINT, "SIGINT", 130}, {syscall.SIGTERM, "SIGTERM", 143}} {
		t.Run(tc.name, func(t *testing.T) {
			dstURL := ckpttest.WithPath(base, "copy-"+tc.name)
			dstURL += "&part_size=5MiB&multipart_threshold=5MiB&concurrency=2"
			dst, err := backend.Open(context.Background(), dstURL)
			require.NoError(t, err)
			defer dst.Close()
			drv := dst.Driver().(*s3.Driver)
			prefix := dst.Prefix()

			cmd, stderr, exited := copyMidUpload(t, bin, src, dstURL, drv, prefix)
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
			assert.Contains(t, msg, "of 4 data objects")
			assert.Contains(t, msg, "the destination has no committed checkpoint")
			assert.Contains(t, msg, "interrupted by "+tc.name)

			assert.Empty(t, incompleteUploads(t, drv, prefix), "incomplete multipart uploads under the destination")
			var objects []string
			require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error {
				objects = append(objects, o.Key)
				return nil
			}))
			assert.Empty(t, objects, "objects at the destination (no metadata, no data)")
			t.Logf("%s: %s", tc.name, msg)
		})
	}
	t.Run("second SIGINT", func(t *testing.T) { secondSignalExitsAtOnce(t, bin, src, base) })
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

	cmd, stderr, exited := copyMidUpload(t, bin, src, dstURL, drv, dst.Prefix())
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

// copyMidUpload starts `ckpt copy src dst` and returns once a multipart
// upload of it is listed under prefix, with the process, its stderr and a
// channel that receives its Wait result.
func copyMidUpload(t *testing.T, bin, src, dstURL string, drv *s3.Driver, prefix string) (*exec.Cmd, *ckpttest.SyncBuffer, chan error) {
	t.Helper()
	stderr := &ckpttest.SyncBuffer{}
	cmd := exec.Command(bin, "copy", "--parallel", "2", src, dstURL)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for len(incompleteUploads(t, drv, prefix)) == 0 {
		select {
		case err := <-exited:
			t.Fatalf("copy ended before any multipart upload was seen: %v\n%s", err, stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "no multipart upload started")
		time.Sleep(10 * time.Millisecond)
	}
	return cmd, stderr, exited
}

// incompleteUploads lists the multipart uploads in progress under prefix.
func incompleteUploads(t *testing.T, d *s3.Driver, prefix string) []string {
	t.Helper()
	var keys []string
	for u := range d.Client().ListIncompleteUploads(context.Background(), d.Bucket(), prefix, true) {
		require.NoError(t, u.Err)
		keys = append(keys, fmt.Sprintf("%s (%s)", u.Key, u.UploadID))
	}
	return keys
}

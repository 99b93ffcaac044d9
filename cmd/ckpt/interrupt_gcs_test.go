package main

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/ckpttest"
)

// Regression (issue 16): an interrupted `ckpt copy` to GCS only stopped
// sending its resumable uploads; their sessions stayed open for a week and
// nothing recorded them. Now SIGTERM mid-upload cancels every session it
// opened and removes its marker: no incomplete upload and no object is
// left, and the exit code is 143.
func TestInterruptedCopyToGCSCancelsItsSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and copies 64 MiB")
	}
	base := cloudURL(t, "CKPTKIT_TEST_GCS_URL")
	bin := buildCkpt(t)
	src := bigCheckpoint(t, 4, 16)
	dstURL := ckpttest.WithPath(base, "copy-sigterm") + "?chunk_size=256KiB"
	dst, err := backend.Open(context.Background(), dstURL)
	require.NoError(t, err)
	defer dst.Close()

	stderr := &ckpttest.SyncBuffer{}
	cmd := exec.Command(bin, "copy", "--parallel", "2", src, dstURL)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); len(uploads(t, dst)) == 0; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-exited:
			t.Fatalf("copy ended before any resumable upload was seen: %v\n%s", err, stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "no resumable upload started")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("copy did not stop within 60s of SIGTERM\n%s", stderr.String())
	}
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit: %v\n%s", err, stderr.String())
	assert.Equal(t, 143, ee.ExitCode(), stderr.String())
	assert.Empty(t, uploads(t, dst), "resumable sessions still recorded under the destination")
	var objects []string
	require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error {
		objects = append(objects, o.Key)
		return nil
	}))
	assert.Empty(t, objects, "objects at the destination")
}

package reliability

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/ckpttest"
)

// countUploads counts the incomplete uploads under the run at url.
func countUploads(t *testing.T, url string) int {
	t.Helper()
	st, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	defer st.Close()
	n := 0
	require.NoError(t, st.ListUploads(context.Background(), "", func(backend.Upload) error { n++; return nil }))
	return n
}

// killDuringUpload starts ckpt args, SIGKILLs it once a multipart upload
// is under url (or after 20 s), and reports whether it caught one.
func killDuringUpload(t *testing.T, url string, args ...string) bool {
	t.Helper()
	cmd := exec.Command(ckptBin, args...)
	require.NoError(t, cmd.Start())
	caught := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if countUploads(t, url) > 0 {
			caught = true
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return caught
}

// Copies and saves to S3 SIGKILLed in the middle of a multipart upload,
// then ckpt gc --grace 0s: no incomplete upload may remain.
func TestNoOrphanUploadsAfterGC(t *testing.T) {
	if s3Run("x") == "" {
		t.Skip("CKPTKIT_TEST_S3_URL not set")
	}
	n := size(10, 2)
	src := filepath.Join(t.TempDir(), "src")
	r := run(t, 2*time.Minute, "train", "--url", src, "--steps", "1", "--save-every", "1", "--state-size", "24MiB")
	require.Equal(t, 0, r.code, r.errs)
	small := "&part_size=5MiB&multipart_threshold=5MiB&concurrency=1"
	interrupted, left, tried := 0, 0, 0
	for i := range 2 * n {
		run := s3Run("orphans") + small
		var caught bool
		if i%2 == 0 {
			caught = killDuringUpload(t, run, "copy", filepath.Join(src, catalog.StepName(1)), ckpttest.WithPath(run, catalog.StepName(1)))
		} else {
			caught = killDuringUpload(t, run, "train", "--url", run, "--steps", "1", "--save-every", "1", "--state-size", "24MiB")
		}
		tried++
		if caught {
			interrupted++
		}
		g := run2(t, "gc", run, "--keep-last", "1", "--grace", "0s")
		require.Equal(t, 0, g.code, g.errs)
		left += countUploads(t, run)
	}
	record(row{Class: "orphan uploads after SIGKILLed copies and saves, then gc", Tried: tried, Survived: tried - left, Lost: left,
		Note: fmt.Sprintf("%d of %d processes killed with a multipart upload open; lost = incomplete uploads left after ckpt gc --grace 0s", interrupted, tried)})
	require.Zero(t, left)
}

// run2 is run with a minute's timeout.
func run2(t *testing.T, args ...string) result { return run(t, time.Minute, args...) }

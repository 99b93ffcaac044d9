package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/iterator"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// countUploads counts the incomplete uploads under the run at url.
func countUploads(t *testing.T, url string) int {
	t.Helper()
	st, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	defer st.Close()
	return len(storetest.Uploads(t, st))
}

// killDuringUpload starts ckpt args, SIGKILLs it once an incomplete upload
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
	t.Logf("killed at %s", time.Now().Format(time.RFC3339Nano))
	// A request the process had sent when it died (another object's
	// CreateMultipartUpload, a session start) may still land at the server
	// a moment later: gc, which in real use runs --grace after, here runs
	// once it has. (The probable cause of one S3 run in 20 that left an
	// upload behind without this wait; not reproduced in 60 more kills. A
	// run that loses logs what is left and when it was started.)
	time.Sleep(settle)
	return caught
}

// settle is how long after the kill gc starts.
const settle = time.Second

// uploadServer is a server the orphan-uploads class runs on.
type uploadServer struct {
	name string
	// setup returns a function making fresh run URLs with small parts, and
	// one (or nil) checking after gc that the sessions a run's killed
	// processes left were cancelled at the server.
	setup func(t *testing.T) (newRun func() string, sessions *sessionWatch)
	what  string
}

// Copies and saves SIGKILLed in the middle of a multipart (S3) or
// resumable (GCS) upload, then ckpt gc --grace 0s: no incomplete upload may
// remain, and on GCS every session a killed process left open was
// cancelled at the server.
func TestNoOrphanUploadsAfterGC(t *testing.T) {
	n := size(10, 2)
	src := filepath.Join(t.TempDir(), "src")
	r := run(t, 2*time.Minute, "train", "--url", src, "--steps", "1", "--save-every", "1", "--state-size", "24MiB")
	require.Equal(t, 0, r.code, r.errs)
	for _, srv := range []uploadServer{
		{"S3", s3Uploads, "multipart upload"},
		{"GCS", gcsUploads, "resumable upload (session marker)"},
	} {
		t.Run(srv.name, func(t *testing.T) {
			newRun, sessions := srv.setup(t)
			interrupted, left, tried, notCancelled, sessionsLeft := 0, 0, 0, 0, 0
			for i := range 2 * n {
				run := newRun()
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
				var open []string
				if sessions != nil {
					open = sessions.openUnder(t, run)
					sessionsLeft += len(open)
				}
				g := run2(t, "gc", run, "--keep-last", "1", "--grace", "0s")
				require.Equal(t, 0, g.code, g.errs)
				lost := countUploads(t, run)
				if lost > 0 {
					logUploads(t, run)
				}
				if sessions != nil {
					for _, id := range open {
						if !sessions.cancelled(id) {
							notCancelled++
							lost++
						}
					}
				}
				left += lost
			}
			note := fmt.Sprintf("%d of %d processes killed with a %s open; lost = incomplete uploads left after ckpt gc --grace 0s (run %v after the kill)", interrupted, tried, srv.what, settle)
			if sessions != nil {
				note += fmt.Sprintf(", or sessions left open that gc did not cancel at the server (%d of the %d the killed processes left)", notCancelled, sessionsLeft)
			}
			record(row{Class: fmt.Sprintf("orphan uploads after SIGKILLed copies and saves, then gc, %s", srv.name), Tried: tried, Survived: tried - left, Lost: left, Note: note})
			require.Positive(t, interrupted, "no process was killed with an upload open: nothing was checked")
			require.Zero(t, left)
		})
	}
}

// s3Uploads runs on the S3 server with 5 MiB parts.
func s3Uploads(t *testing.T) (func() string, *sessionWatch) {
	storetest.TestURL(t, "CKPTKIT_TEST_S3_URL")
	return func() string { return s3Run("orphans") + "&part_size=5MiB&multipart_threshold=5MiB&concurrency=1" }, nil
}

// gcsUploads runs on the GCS emulator with 1 MiB chunks, every process
// (the killed ones, gc, this test) talking to it through a proxy that
// records the sessions cancelled (DELETE on the session URI). The emulator
// answers a cancellation with 499 but keeps the session (a deviation of
// fake-gcs-server: real GCS forgets it), so the test checks that the
// cancellation reached the server rather than querying the session after.
func gcsUploads(t *testing.T) (func() string, *sessionWatch) {
	storetest.TestURL(t, ckpttest.GCSURLEnv)
	storetest.TestURL(t, "STORAGE_EMULATOR_HOST")
	host := os.Getenv("STORAGE_EMULATOR_HOST")
	p, err := faultproxy.New("http://" + strings.TrimPrefix(host, "http://"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	w := &sessionWatch{deleted: map[string]bool{}}
	p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		if id := r.URL.Query().Get("upload_id"); id != "" && r.Method == http.MethodDelete {
			w.mu.Lock()
			w.deleted[id] = true
			w.mu.Unlock()
		}
		return false
	}})
	t.Setenv("STORAGE_EMULATOR_HOST", p.Host()) // inherited by every ckpt process
	return func() string { return gcsRun("orphans") + "?chunk_size=1MiB" }, w
}

// sessionWatch records the resumable sessions cancelled at the server.
type sessionWatch struct {
	mu      sync.Mutex
	deleted map[string]bool
}

func (w *sessionWatch) cancelled(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleted[id]
}

// openUnder reads the session markers under the run at raw, as anyone
// looking at the bucket would, and returns their sessions' upload ids.
func (w *sessionWatch) openUnder(t *testing.T, raw string) []string {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, raw)
	require.NoError(t, err)
	defer st.Close()
	d := st.Driver().(*gcs.Driver)
	bkt := d.Client().Bucket(d.Bucket())
	var ids []string
	it := bkt.Objects(ctx, &storage.Query{Prefix: st.Prefix()})
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return ids
		}
		require.NoError(t, err)
		if !strings.Contains(a.Name, gcs.MarkerDir+"/") {
			continue
		}
		r, err := bkt.Object(a.Name).NewReader(ctx)
		require.NoError(t, err)
		body, err := io.ReadAll(r)
		r.Close()
		require.NoError(t, err)
		var m struct{ Session string }
		require.NoError(t, json.Unmarshal(body, &m), "marker %s", a.Name)
		u, err := url.Parse(m.Session)
		require.NoError(t, err, "marker %s", a.Name)
		id := u.Query().Get("upload_id")
		require.NotEmpty(t, id, "marker %s names a session", a.Name)
		ids = append(ids, id)
	}
}

// logUploads logs the incomplete uploads under the run at raw, with when
// they were started.
func logUploads(t *testing.T, raw string) {
	st, err := backend.Open(context.Background(), raw)
	require.NoError(t, err)
	defer st.Close()
	for _, u := range storetest.Uploads(t, st) {
		t.Logf("left after gc: %s (id %s), started %s", u.Key, u.ID, u.Initiated.Format(time.RFC3339Nano))
	}
}

// run2 is run with a minute's timeout.
func run2(t *testing.T, args ...string) result { return run(t, time.Minute, args...) }

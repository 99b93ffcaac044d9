package main

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/metadata"
)

// Regression (issue 30 item 2): with the S3 server stopped (SIGSTOP) in
// the middle of a run, `ckpt train` exited 130, as if interrupted, after
// 93 s though no signal was sent. The S3 driver bounds the start of a
// multipart upload (and its completion, and its abort) by 30 s of its own;
// a stopped server ran that bound out, the context error was classed as
// a cancellation, and cancellation is exit 130. Now a request without
// progress for the stall timeout (here 1 s, from CKPTKIT_STALL_TIMEOUT)
// fails as stalled, is retried as transient, and the run exits 5 naming
// the object and how long it waited. The server "stops" at the first
// CreateMultipartUpload after the first checkpoint is committed: a proxy
// accepts that request and every later one and answers nothing. (On the
// code before the fix this test exits 130 after 30 s.)
func TestStalledStorageExitsTransient(t *testing.T) {
	raw := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	u, err := url.Parse(raw)
	require.NoError(t, err)
	p, err := faultproxy.New("http://" + u.Query().Get("endpoint"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	q := u.Query()
	q.Set("endpoint", p.Host())
	q.Set("part_size", "5MiB")
	q.Set("multipart_threshold", "5MiB")
	u.RawQuery = q.Encode()
	var committed, stopped atomic.Bool
	stalled := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		if committed.Load() && r.Method == http.MethodPost && r.URL.Query().Has("uploads") {
			stopped.Store(true)
		}
		return stopped.Load()
	}, Break: faultproxy.Stall})
	p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+metadata.ObjectKey) {
			committed.Store(true)
		}
		return false
	}})
	t.Setenv(backend.StallTimeoutEnv, "1s")
	start := time.Now()
	cmd, _, errb := startCkpt(t, "train", "--url", u.String(), "--steps", "50", "--save-every", "1", "--state-size", "12MiB")
	code := exitStatus(t, cmd)
	elapsed := time.Since(start)
	t.Logf("exit %d after %s, %d requests stalled; stderr:\n%s", code, elapsed.Round(time.Millisecond), p.Count(stalled), errb)
	require.Equal(t, 5, code, "a stalled server is transient (exit 5), not an interrupt: %s", errb)
	require.NotContains(t, errb.String(), "SIGINT")
	require.Contains(t, errb.String(), "no progress for 1s")
	require.Contains(t, errb.String(), strings.SplitN(raw, "?", 2)[0], "the message names the object's URL")
	require.GreaterOrEqual(t, p.Count(stalled), backend.DefaultRetryPolicy.Attempts, "the stalled request was retried")
}

// Issue 30 item 1 through the binary: `ckpt copy` streams each object
// (a source the Store cannot rewind, so only the completion can be
// retried) into multipart uploads on S3, and the first completion of
// every object is dropped: before the server acted (reset) for one run,
// after it acted (the answer cut) for the other. Each copy exits 0, the
// copy verifies --deep, holds exactly the source's objects, and no
// incomplete upload is left. Before the fix the copy failed (exit 5: the
// completion was not retried, the streamed object could not be).
func TestCopyWithDroppedCompletionsSucceeds(t *testing.T) {
	src := bigCheckpoint(t, 2, 12)
	for name, b := range map[string]faultproxy.Break{"before the server acted": faultproxy.Reset, "after it acted": faultproxy.CutBody} {
		t.Run(name, func(t *testing.T) {
			raw := cloudURL(t, "CKPTKIT_TEST_S3_URL")
			u, err := url.Parse(raw)
			require.NoError(t, err)
			p, err := faultproxy.New("http://" + u.Query().Get("endpoint"))
			require.NoError(t, err)
			t.Cleanup(p.Close)
			q := u.Query()
			q.Set("endpoint", p.Host())
			q.Set("part_size", "5MiB")
			q.Set("multipart_threshold", "5MiB")
			u.RawQuery = q.Encode()
			var mu sync.Mutex
			seen := map[string]bool{}
			drop := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
				if r.Method != http.MethodPost || !r.URL.Query().Has("uploadId") {
					return false
				}
				mu.Lock()
				defer mu.Unlock()
				first := !seen[r.URL.Path]
				seen[r.URL.Path] = true
				return first
			}, Break: b})
			code, _, errs := ckpt(t, "copy", src, u.String())
			require.Equal(t, 0, code, errs)
			require.Equal(t, 2, p.Failed(drop), "the completion of each data object was dropped once")
			p.Clear()
			code, out, errs := ckpt(t, "verify", "--deep", u.String())
			require.Equal(t, 0, code, "%s\n%s", out, errs)
			dst, err := backend.Open(context.Background(), u.String())
			require.NoError(t, err)
			defer dst.Close()
			var got []string
			require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error { got = append(got, o.Key); return nil }))
			want, err := filepath.Glob(filepath.Join(src, "*"))
			require.NoError(t, err)
			for i := range want {
				want[i] = filepath.Base(want[i])
			}
			require.ElementsMatch(t, want, got, "exactly the source's objects")
			require.Empty(t, uploads(t, dst), "no incomplete upload")
		})
	}
}

package gcs_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

const unavailable = `{"error":{"code":503,"message":"backend unavailable","errors":[{"reason":"backendError","message":"backend unavailable"}]}}`

var retryPolicy = backend.RetryPolicy{Attempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}

// proxiedStore opens a scratch store on the GCS emulator through a
// fault-injecting proxy (the driver finds the emulator by
// STORAGE_EMULATOR_HOST, so the test cannot run in parallel).
func proxiedStore(t *testing.T, kv ...string) (*backend.Store, *faultproxy.Proxy) {
	t.Helper()
	testURL(t)
	p, err := faultproxy.New("http://" + strings.TrimPrefix(getenvEmulator(t), "http://"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	t.Setenv("STORAGE_EMULATOR_HOST", p.Host())
	st := openStore(t, kv...)
	t.Cleanup(p.Clear) // runs before the scratch clean-up, which must pass
	return st.WithRetry(retryPolicy), p
}

func getenvEmulator(t *testing.T) string {
	t.Helper()
	h := strings.TrimSpace(os.Getenv("STORAGE_EMULATOR_HOST"))
	if h == "" {
		t.Skip("STORAGE_EMULATOR_HOST is unset")
	}
	return h
}

func fail503(match func(*http.Request) bool) *faultproxy.Rule {
	return &faultproxy.Rule{Match: match, Status: http.StatusServiceUnavailable, Body: unavailable, ContentType: "application/json"}
}

func isUpload(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/upload/") }

// Regression (issue 12 item 6): the client retried every write until a
// deadline, under the Store's 4 tries. Now a failing upload request is
// sent RetryPolicy.Attempts times in all.
func TestRetrySingleUploadTriedAttemptsTimes(t *testing.T) {
	st, p := proxiedStore(t)
	rule := p.Add(fail503(isUpload))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := st.PutBytes(ctx, "small", []byte("hello"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, retryPolicy.Attempts, p.Count(rule), "upload requests at the server")
}

// A resumable upload whose chunks keep failing: the client does not retry
// the chunk, the Store retries the whole Put from its rewound source. Each
// failed attempt cancels its own session and removes its marker.
func TestRetryResumableChunkTriedAttemptsTimes(t *testing.T) {
	st, p := proxiedStore(t, "chunk_size", "256KiB")
	// The emulator takes chunks as PUTs or POSTs naming the session's
	// upload_id; a DELETE naming it cancels the session.
	chunks := p.Add(fail503(func(r *http.Request) bool { return isSessionRequest(r) && r.Method != http.MethodDelete }))
	starts := p.Add(&faultproxy.Rule{Match: isSessionStart, Fail: func(int) bool { return false }})
	cancels := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool { return isSessionRequest(r) && r.Method == http.MethodDelete },
		Fail: func(int) bool { return false }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := st.PutBytes(ctx, "big", bytes.Repeat([]byte("x"), 1<<20), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, retryPolicy.Attempts, p.Count(chunks), "chunk requests at the server")
	assert.Equal(t, retryPolicy.Attempts, p.Count(starts), "resumable sessions started")
	assert.Equal(t, retryPolicy.Attempts, p.Count(cancels), "every failed attempt cancelled its session")
	p.Clear()
	ok, err := st.Exists(context.Background(), "big")
	require.NoError(t, err)
	assert.False(t, ok, "a failed upload publishes nothing")
	assert.Empty(t, storetest.Uploads(t, st), "no marker is left")
}

// isSessionStart matches the request that opens a resumable session.
func isSessionStart(r *http.Request) bool {
	return isUpload(r) && r.Method == http.MethodPost && r.URL.Query().Get("uploadType") == "resumable" && !r.URL.Query().Has("upload_id")
}

// isSessionRequest matches a request on an open session (its URI names
// the upload_id): a chunk, a status query or a cancellation.
func isSessionRequest(r *http.Request) bool { return isUpload(r) && r.URL.Query().Has("upload_id") }

// Reads are retried by the Store alone too.
func TestRetryStatTriedAttemptsTimes(t *testing.T) {
	st, p := proxiedStore(t)
	require.NoError(t, st.PutBytes(context.Background(), "k", []byte("v"), backend.PutOptions{}))
	rule := p.Add(fail503(func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/o/"+st.Prefix()+"k") ||
			strings.HasSuffix(r.URL.EscapedPath(), "/o/"+strings.ReplaceAll(st.Prefix(), "/", "%2F")+"k")
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := st.Stat(ctx, "k")
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, retryPolicy.Attempts, p.Count(rule), "metadata GETs at the server")
}

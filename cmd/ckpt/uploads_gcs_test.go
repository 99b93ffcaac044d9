package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/internal/ckpttest"
)

// openSession opens a resumable upload session for object name of bucket
// on the GCS emulator, as a writer's first request does, and returns its
// URI.
func openSession(t *testing.T, bucket, name string) string {
	t.Helper()
	host := strings.TrimPrefix(os.Getenv("STORAGE_EMULATOR_HOST"), "http://")
	q := url.Values{"uploadType": {"resumable"}, "name": {name}}
	resp, err := http.Post("http://"+host+"/upload/storage/v1/b/"+bucket+"/o?"+q.Encode(), "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	loc := resp.Header.Get("Location")
	require.NotEmpty(t, loc)
	return loc
}

// Regression (issue 16): GCS resumable sessions of a killed save or copy
// could not be found by anything. What a SIGKILL leaves on GCS is an open
// session and its marker (docs/FORMAT.md); ckpt gc lists it (--dry-run),
// keeps it while younger than --grace, then cancels the session and
// removes the marker, leaving the committed checkpoint untouched.
func TestGCAbortsAbandonedGCSUploads(t *testing.T) {
	run := cloudURL(t, "CKPTKIT_TEST_GCS_URL")
	trainJSON(t, "--url", run, "--steps", "2", "--save-every", "2")
	ctx := context.Background()
	st, err := backend.Open(ctx, run)
	require.NoError(t, err)
	defer st.Close()
	d := st.Driver().(*gcs.Driver)
	key := st.Prefix() + "step-00000004/rank-00000-000.0123456789abcdef.data"
	session := openSession(t, d.Bucket(), key)
	body, err := json.Marshal(map[string]any{"version": 1, "key": key, "session": session})
	require.NoError(t, err)
	marker := st.Prefix() + "step-00000004/" + gcs.MarkerDir + "/rank-00000-000.0123456789abcdef.data/00112233445566778899aabb"
	w := d.Client().Bucket(d.Bucket()).Object(marker).NewWriter(ctx)
	_, err = w.Write(body)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.Len(t, uploads(t, st), 1)

	code, out, errs := ckpt(t, "gc", run, "--keep-last", "1", "--grace", "1h")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "incomplete", "younger than the grace period: kept")
	require.Len(t, uploads(t, st), 1)

	code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s", "--dry-run")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "upload step-00000004/rank-00000-000.0123456789abcdef.data (started ")
	require.Contains(t, out, "would abort 1 incomplete upload(s)")
	require.NotContains(t, out+errs, session, "the session URI is a credential: never printed")
	require.Len(t, uploads(t, st), 1)

	code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s", "--json")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out+errs, session)
	var res struct {
		Result struct {
			UploadsAborted int `json:"uploads_aborted"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]), &res), out)
	require.Equal(t, 1, res.Result.UploadsAborted, out)
	require.Empty(t, uploads(t, st))
	code, vout, errs := ckpt(t, "verify", "--deep", ckpttest.WithPath(run, "step-00000002"))
	require.Equal(t, 0, code, "the committed checkpoint is untouched: %s%s", vout, errs)
}

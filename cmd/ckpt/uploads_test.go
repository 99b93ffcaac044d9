package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// uploads lists the incomplete uploads under st.
func uploads(t *testing.T, st *backend.Store) []backend.Upload { return storetest.Uploads(t, st) }

// abandonedKey is the data object the abandoned uploads below would have
// created, relative to the run.
const abandonedKey = "step-00000004/rank-00000-000.0123456789abcdef.data"

// abandonS3Upload leaves what a SIGKILL during a multipart save leaves on
// S3: a started upload with a part, never completed. It returns "" (no
// secret to keep out of the output).
func abandonS3Upload(t *testing.T, st *backend.Store) string {
	ctx := context.Background()
	d := st.Driver().(*s3.Driver)
	core := minio.Core{Client: d.Client()}
	key := st.Prefix() + abandonedKey
	id, err := core.NewMultipartUpload(ctx, d.Bucket(), key, minio.PutObjectOptions{})
	require.NoError(t, err)
	part := bytes.Repeat([]byte("x"), 5<<20)
	_, err = core.PutObjectPart(ctx, d.Bucket(), key, id, 1, bytes.NewReader(part), int64(len(part)), minio.PutObjectPartOptions{})
	require.NoError(t, err)
	return ""
}

// abandonGCSUpload leaves what a SIGKILL during a resumable upload leaves
// on GCS: an open session (opened as a writer's first request does) and
// its marker (docs/FORMAT.md). It returns the session URI, a credential
// the output must never show.
func abandonGCSUpload(t *testing.T, st *backend.Store) string {
	ctx := context.Background()
	d := st.Driver().(*gcs.Driver)
	key := st.Prefix() + abandonedKey
	host := strings.TrimPrefix(os.Getenv("STORAGE_EMULATOR_HOST"), "http://")
	q := url.Values{"uploadType": {"resumable"}, "name": {key}}
	resp, err := http.Post("http://"+host+"/upload/storage/v1/b/"+d.Bucket()+"/o?"+q.Encode(), "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	session := resp.Header.Get("Location")
	require.NotEmpty(t, session)
	body, err := json.Marshal(map[string]any{"version": 1, "key": key, "session": session})
	require.NoError(t, err)
	dir, name, _ := strings.Cut(abandonedKey, "/")
	marker := st.Prefix() + dir + "/" + gcs.MarkerDir + "/" + name + "/00112233445566778899aabb"
	w := d.Client().Bucket(d.Bucket()).Object(marker).NewWriter(ctx)
	_, err = w.Write(body)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return session
}

// Regression (issue 16): a save or copy killed mid-upload left multipart
// uploads (52 in one campaign, 1.5 GB of parts) on S3 and open resumable
// sessions on GCS that nothing listed or aborted. ckpt gc lists them
// (--dry-run) and aborts those older than --grace; younger ones, which a
// running save may still complete, stay; the committed checkpoint is
// untouched.
func TestGCAbortsAbandonedUploads(t *testing.T) {
	for _, srv := range []struct {
		name, env string
		abandon   func(*testing.T, *backend.Store) string
	}{
		{"S3", "CKPTKIT_TEST_S3_URL", abandonS3Upload},
		{"GCS", "CKPTKIT_TEST_GCS_URL", abandonGCSUpload},
	} {
		t.Run(srv.name, func(t *testing.T) {
			run := cloudURL(t, srv.env)
			trainJSON(t, "--url", run, "--steps", "2", "--save-every", "2")
			st, err := backend.Open(context.Background(), run)
			require.NoError(t, err)
			defer st.Close()
			secret := srv.abandon(t, st)
			require.Len(t, uploads(t, st), 1)
			noSecret := func(s string) {
				if secret != "" {
					require.NotContains(t, s, secret, "the session URI is a credential: never printed")
				}
			}

			code, out, errs := ckpt(t, "gc", run, "--keep-last", "1", "--grace", "1h")
			require.Equal(t, 0, code, errs)
			require.NotContains(t, out, "incomplete", "younger than the grace period: kept")
			require.Len(t, uploads(t, st), 1)

			code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s", "--dry-run")
			require.Equal(t, 0, code, errs)
			require.Contains(t, out, "upload "+abandonedKey+" (")
			require.Contains(t, out, "would abort 1 incomplete upload(s)")
			noSecret(out + errs)
			require.Len(t, uploads(t, st), 1)

			code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s", "--json")
			require.Equal(t, 0, code, errs)
			noSecret(out + errs)
			var res struct {
				Result struct {
					UploadsAborted int `json:"uploads_aborted"`
				} `json:"result"`
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), out)
			require.Equal(t, 1, res.Result.UploadsAborted, out)
			require.Empty(t, uploads(t, st))
			code, vout, errs := ckpt(t, "verify", "--deep", ckpttest.WithPath(run, "step-00000002"))
			require.Equal(t, 0, code, "the committed checkpoint is untouched: %s%s", vout, errs)
		})
	}
}

package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// cloudURL returns a fresh prefix under the test server URL in env, or
// skips (fails under CI=true) when the servers are not running.
func cloudURL(t *testing.T, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: start the servers with scripts/test-servers.sh", env)
		}
		t.Skipf(`%s not set; run: eval "$(scripts/test-servers.sh start)"`, env)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	base, query, _ := strings.Cut(u, "?")
	out := strings.TrimSuffix(base, "/") + "/cli-" + hex.EncodeToString(b[:])
	if query != "" {
		out += "?" + query
	}
	return out
}

// Train on S3, copy the step-6 checkpoint to GCS, resume from the GCS copy:
// the weights match an uninterrupted local run bit for bit.
func TestTrainS3CopyToGCSResume(t *testing.T) {
	s3, gs := cloudURL(t, "CKPTKIT_TEST_S3_URL"), cloudURL(t, "CKPTKIT_TEST_GCS_URL")
	straight := trainJSON(t, "--url", t.TempDir(), "--steps", "12", "--save-every", "3")

	trainJSON(t, "--url", s3, "--steps", "6", "--save-every", "3", "--ranks", "4")
	// The URLs latest prints keep the store's non-secret options (the test
	// server's endpoint): fed back as they are, they reach the same server.
	for _, run := range []string{s3, gs} {
		if run == gs {
			code, _, errs := ckpt(t, "copy", ckpttest.WithPath(s3, "step-00000003"), ckpttest.WithPath(gs, "step-00000003"))
			require.Equal(t, 0, code, errs)
		}
		code, out, errs := ckpt(t, "latest", "--json", run)
		require.Equal(t, 0, code, errs)
		var found struct {
			URL        string               `json:"url"`
			Checkpoint struct{ URL string } `json:"checkpoint"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &found))
		_, query, _ := strings.Cut(run, "?")
		_, printed, _ := strings.Cut(found.Checkpoint.URL, "?")
		require.Equal(t, sortedQuery(t, query), sortedQuery(t, printed), "latest keeps the options of %s: %s", run, found.Checkpoint.URL)
		code, out, errs = ckpt(t, "verify", found.Checkpoint.URL)
		require.Equal(t, 0, code, "%s\n%s", out, errs)
	}
	code, out, errs := ckpt(t, "copy", "--json", ckpttest.WithPath(s3, "step-00000006"), ckpttest.WithPath(gs, "step-00000006"))
	require.Equal(t, 0, code, errs)
	var res struct{ Objects int }
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Greater(t, res.Objects, 1)

	code, _, errs = ckpt(t, "copy", ckpttest.WithPath(s3, "step-00000006"), ckpttest.WithPath(gs, "step-00000006"))
	require.Equal(t, 6, code, "a committed destination is refused without --force (conflict): %s", errs)
	require.Contains(t, errs, "already holds a committed checkpoint")

	code, out, _ = ckpt(t, "verify", "--deep", ckpttest.WithPath(gs, "step-00000006"))
	require.Equal(t, 0, code, out)
	resumed := trainJSON(t, "--url", gs, "--steps", "12", "--save-every", "3", "--ranks", "2", "--resume")
	require.Equal(t, int64(6), *resumed.ResumedFrom)
	require.Equal(t, straight.WeightsSHA256, resumed.WeightsSHA256)
}

// The PyTorch DCP fixtures, copied to S3 and GCS, inspect and verify there.
func TestDCPFixturesOnObjectStores(t *testing.T) {
	fixtures, err := filepath.Abs("../../interop/torchdcp/testdata")
	require.NoError(t, err)
	for _, env := range []string{"CKPTKIT_TEST_S3_URL", "CKPTKIT_TEST_GCS_URL"} {
		base := cloudURL(t, env)
		for _, c := range []string{"dense", "sparse_optim", "frozen", "nested_unflattened"} {
			dst := ckpttest.WithPath(base, c)
			code, _, errs := ckpt(t, "copy", filepath.Join(fixtures, c), dst)
			require.Equal(t, 0, code, "%s %s: %s", env, c, errs)
			code, out, errs := ckpt(t, "inspect", "--json", "--hash", dst)
			require.Equal(t, 0, code, errs)
			require.Contains(t, out, `"format":"torch-dcp"`)
			if c != "nested_unflattened" { // its tensors hide inside pickled values
				require.Contains(t, out, `"sha256"`)
			}
			code, out, _ = ckpt(t, "verify", "--deep", dst)
			require.Equal(t, 0, code, "%s %s: %s", env, c, out)
			require.Contains(t, out, "torch-1.13")
		}
	}
}

// sortedQuery returns a URL query re-encoded in sorted order.
func sortedQuery(t *testing.T, raw string) string {
	t.Helper()
	q, err := url.ParseQuery(raw)
	require.NoError(t, err)
	return q.Encode()
}

// An https request answered in plain HTTP (a local S3 server without
// insecure=true) is a usage error that says what to add, exit 2.
func TestPlainHTTPEndpointSaysInsecure(t *testing.T) {
	u := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	base, query, _ := strings.Cut(u, "?")
	q, err := url.ParseQuery(query)
	require.NoError(t, err)
	if q.Get("insecure") != "true" {
		t.Skip("the test server speaks https")
	}
	q.Del("insecure")
	code, out, errs := ckpt(t, "ls", base+"?"+q.Encode())
	require.Equal(t, 2, code, "%s%s", out, errs)
	require.Contains(t, errs, "add insecure=true to the URL")
	require.NotContains(t, errs, "is reachable", "no misleading hint")
}

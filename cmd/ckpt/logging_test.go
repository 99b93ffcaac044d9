package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// S3 without credentials: exit 4, and the error says what to check:
// credentials found or not, endpoint, region; the URL once per line.
func TestAccessErrorSaysWhatToCheck(t *testing.T) {
	u := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	code, out, errs := ckpt(t, "ls", u)
	require.Equal(t, 4, code, "%s%s", out, errs)
	require.Contains(t, errs, "check: no credentials found")
	require.Contains(t, errs, "endpoint 127.0.0.1:")
	require.Contains(t, errs, "region us-east-1")

	code, out, _ = ckpt(t, "ls", "--json", u)
	require.Equal(t, 4, code)
	d := validDocument(t, out)
	require.Equal(t, "access", d.Error.Class)
	require.Contains(t, d.Error.Message, "no credentials found")
}

func TestVerboseQuietAndLogLevel(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")

	code, out, errs := ckpt(t, "-q", "train", run, "--steps", "3", "--save-every", "3")
	require.Equal(t, 0, code, errs)
	require.Empty(t, errs, "-q: no notes")
	require.Contains(t, out, "weights_sha256")

	// -vv: every storage request, at debug.
	code, _, errs = ckpt(t, "-vv", "ls", run)
	require.Equal(t, 0, code)
	require.Regexp(t, `level=DEBUG msg="storage request" store=file://\S+ op=list-delimited`, errs)
	code, _, errs = ckpt(t, "--log-level", "debug", "verify", filepath.Join(run, "step-00000003"))
	require.Equal(t, 0, code)
	require.Contains(t, errs, "op=read")
	code, _, errs = ckpt(t, "ls", run)
	require.Equal(t, 0, code)
	require.NotContains(t, errs, "storage request", "warn by default")
	code, _, errs = ckpt(t, "--log-level", "loud", "ls", run)
	require.Equal(t, 2, code)
	require.Contains(t, errs, "--log-level")

	// -v with stderr not a terminal: plain progress lines.
	defer func(d time.Duration) { progressInterval = d }(progressInterval)
	progressInterval = 0
	code, _, errs = ckpt(t, "-v", "copy", filepath.Join(run, "step-00000003"), filepath.Join(dir, "copy"))
	require.Equal(t, 0, code, errs)
	line := regexp.MustCompile(`(?m)^copy: [\d.]+ [KMG]?i?B / ([\d.]+ [KMG]?i?B), [\d.]+ [KMG]?i?B/s, ETA \S+$`)
	require.Regexp(t, line, errs)
	// Without -v, nothing: stderr is not a terminal.
	code, _, errs = ckpt(t, "copy", "--force", filepath.Join(run, "step-00000003"), filepath.Join(dir, "copy"))
	require.Equal(t, 0, code, errs)
	require.False(t, strings.Contains(errs, "copy:"), errs)
	// --progress forces the bar.
	code, _, errs = ckpt(t, "--progress", "copy", "--force", filepath.Join(run, "step-00000003"), filepath.Join(dir, "copy"))
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "copy ETA")
}

// Every long operation draws its progress (forced with --progress, as
// stderr is not a terminal here): done / total and an ETA.
func TestEveryLongOperationShowsProgress(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	step := filepath.Join(run, "step-00000006")
	cases := [][]string{
		{"train", run, "--steps", "6", "--save-every", "3"},
		{"copy", step, filepath.Join(dir, "copy")},
		{"verify", "--deep", step},
		{"latest", "--deep", run},
		{"inspect", "--hash", step},
		{"diff", step, filepath.Join(dir, "copy")},
		{"convert", step, filepath.Join(dir, "st"), "--to", "safetensors"},
		{"gc", run, "--keep-last", "1", "--grace", "0s"},
	}
	for _, args := range cases {
		code, _, errs := ckpt(t, append([]string{"--progress"}, args...)...)
		require.Equal(t, 0, code, "%v: %s", args, errs)
		label := args[0]
		frame := regexp.MustCompile(regexp.QuoteMeta(label) + ` ETA \S+ +\d+% \|[^|]*\| \(\s*[\d.]+(?:[\s\x{00a0}][KMG]?i?B)?/[\d.]+`)
		require.Regexp(t, frame, errs, "%v", args)
	}
}

// -vv logs each retry of the Store's retry loop.
func TestVerboseLogsRetries(t *testing.T) {
	u := slowDownS3(t)
	code, _, errs := ckpt(t, "-vv", "ls", u)
	require.Equal(t, 5, code, errs)
	require.Regexp(t, `level=DEBUG msg="storage retry" store="s3://bucket/run\?`, errs)
}

// A storage error names its URL once (catalog wrapped the Store's error,
// which names it already, in "list run URL: ...").
func TestStorageErrorNamesTheURLOnce(t *testing.T) {
	u := slowDownS3(t)
	code, _, errs := ckpt(t, "ls", u)
	require.Equal(t, 5, code, errs)
	require.Equal(t, 1, strings.Count(errs, "s3://bucket/run"), errs)
}

// An endpoint that cannot be reached: the error says to check it.
func TestUnreachableEndpointSaysWhatToCheck(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testtesttest")
	code, _, errs := ckpt(t, "ls", "s3://bucket/run?endpoint=nohost.invalid:9&insecure=true&region=us-east-1")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, "check: the endpoint nohost.invalid:9 is reachable")
}

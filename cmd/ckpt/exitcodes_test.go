package main

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// readmeExitCodes parses the "Exit codes" table of README.md: rows
// "| code | class | meaning |".
func readmeExitCodes(t *testing.T) map[string]int {
	t.Helper()
	f, err := os.Open("../../README.md")
	require.NoError(t, err)
	defer f.Close()
	row := regexp.MustCompile("^\\| *([0-9]+) *\\| *`([a-z-]+)` *\\|")
	codes := map[string]int{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Exit codes"
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			n, _ := strconv.Atoi(m[1])
			codes[m[2]] = n
		}
	}
	require.NoError(t, sc.Err())
	return codes
}

// The README's table is the CLI's table: every class, the same code.
func TestExitCodeTableMatchesREADME(t *testing.T) {
	doc := readmeExitCodes(t)
	require.Len(t, doc, len(ckpterr.Classes), "README lists every class once: %v", doc)
	for _, c := range ckpterr.Classes {
		require.Contains(t, doc, c.String())
		require.Equal(t, exitCodes[c], doc[c.String()], "class %s", c)
	}
}

// One real error of every class but internal, driven through the command
// line, exits with its documented code.
func TestOneErrorOfEveryClassThroughTheCLI(t *testing.T) {
	doc := readmeExitCodes(t)
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	trainJSON(t, "--url", runDir, "--steps", "3", "--save-every", "3")
	good := filepath.Join(runDir, "step-00000003")

	// bad-checkpoint: a real DCP checkpoint whose pickled .metadata is cut.
	dcp := filepath.Join(dir, "dcp")
	ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", dcp)
	md, err := os.ReadFile(filepath.Join(dcp, ".metadata"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dcp, ".metadata"), md[:len(md)/2], 0o644))

	// bad-checkpoint: a committed checkpoint one of whose data objects is
	// gone is a bad checkpoint, not a "not found".
	holed := filepath.Join(dir, "holed")
	ckpttest.CopyDir(t, good, holed)
	holedObject := dataObject(t, holed, 0)
	require.NoError(t, os.Remove(holedObject))

	// unsupported: a native checkpoint from a future major format version.
	future := filepath.Join(dir, "future")
	ckpttest.CopyDir(t, good, future)
	mdPath := filepath.Join(future, "ckptkit.metadata.json")
	raw, err := os.ReadFile(mdPath)
	require.NoError(t, err)
	bumped := regexp.MustCompile(`"version": *"1\.[0-9]+"`).ReplaceAll(raw, []byte(`"version":"9.0"`))
	require.NotEqual(t, raw, bumped, "the metadata names its version")
	require.NoError(t, os.WriteFile(mdPath, bumped, 0o644))

	// access: a plugin whose binary does not match its pin is never run.
	plugDir := filepath.Join(dir, "plugins")
	require.NoError(t, os.MkdirAll(plugDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(plugDir, "fakeplugin"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(plugDir, "ckptkit-plugins.lock"), []byte(strings.Repeat("0", 64)+"  fakeplugin\n"), 0o644))

	// transient: an S3 endpoint that answers every request with 503 SlowDown.
	slowURL := slowDownS3(t)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	cases := []struct {
		class ckpterr.Class
		ctx   context.Context
		args  []string
		want  string // in stderr
	}{
		{ckpterr.BadCheckpoint, nil, []string{"verify", dcp}, ".metadata"},
		{ckpterr.BadCheckpoint, nil, []string{"inspect", dcp}, ".metadata"},
		{ckpterr.BadCheckpoint, nil, []string{"copy", holed, filepath.Join(dir, "holed-copy")}, "data object named by the metadata is missing"},
		{ckpterr.BadCheckpoint, nil, []string{"inspect", "--hash", holed}, filepath.Base(holedObject)},
		{ckpterr.Usage, nil, []string{"train", "--bogus-flag"}, "bogus-flag"},
		{ckpterr.Usage, nil, []string{"inspect"}, "arg"},
		{ckpterr.Usage, nil, []string{"inspect", "nosuchscheme://x"}, "registered schemes"},
		// Regressions: URLs a driver refuses were unclassified (exit 10).
		{ckpterr.Usage, nil, []string{"ls", "s3://b/run?endpoint=127.0.0.1:1&insecure=true"}, "bucket"},
		{ckpterr.Usage, nil, []string{"ls", "s3://bucket/run?endpoint=127.0.0.1:1&bogus=1"}, "bogus"},
		{ckpterr.NotFound, nil, []string{"inspect", filepath.Join(dir, "no-such-dir")}, "no-such-dir"},
		{ckpterr.Access, nil, []string{"--plugin-dir", plugDir, "plugins", "list"}, "pin"},
		{ckpterr.Transient, nil, []string{"ls", slowURL}, "bucket"},
		{ckpterr.Conflict, nil, []string{"copy", good, good}, "committed"},
		{ckpterr.Unsupported, nil, []string{"inspect", future}, "newer"},
		{ckpterr.Canceled, cancelled, []string{"verify", "--deep", good}, "canceled"},
	}
	for _, c := range cases {
		t.Run(c.class.String()+"/"+c.args[0], func(t *testing.T) {
			ctx := c.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			var out, errb strings.Builder
			code := run(ctx, c.args, &out, &errb)
			require.Equal(t, doc[c.class.String()], code, "ckpt %v: %s", c.args, errb.String())
			require.Contains(t, errb.String(), c.want)

			// With --json, the same error is one document on stdout:
			// {"error": {"class", "message", "url"}}, valid against the
			// schema of docs/CLI.md.
			out.Reset()
			errb.Reset()
			args := withJSON(c.args)
			code = run(ctx, args, &out, &errb)
			require.Equal(t, doc[c.class.String()], code, "ckpt %v: %s", args, errb.String())
			d := validDocument(t, out.String())
			require.NotNil(t, d.Error, "ckpt %v: %s", args, out.String())
			require.Equal(t, c.class.String(), d.Error.Class)
			require.Contains(t, d.Error.Message, c.want)
			if c.class != ckpterr.Usage && c.class != ckpterr.Access {
				require.NotEmpty(t, d.Error.URL, "the error names its URL: %s", out.String())
			}
		})
	}
}

// slowDownS3 starts an S3 endpoint that answers every request with 503
// SlowDown and returns the URL of a run on it (with test credentials set).
func slowDownS3(t *testing.T) string {
	t.Helper()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`))
	}))
	t.Cleanup(slow.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testtesttest")
	return "s3://bucket/run?endpoint=" + strings.TrimPrefix(slow.URL, "http://") + "&insecure=true&region=us-east-1"
}

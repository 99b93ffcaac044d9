package s3_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
)

// isComplete matches the CompleteMultipartUpload requests.
func isComplete(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Query().Has("uploadId")
}

// Regression (issue 30 item 1): one dropped connection on the
// CompleteMultipartUpload failed the save (exit 10, internal), whether the
// server had completed the upload or not. The completion is now retried
// under the Store's policy, and a retry that finds the upload completed by
// the attempt whose answer was lost (NoSuchUpload, or 412 for a
// create-if-absent) recognises the object as its own. Each case ends with
// exactly one object holding the bytes, no incomplete upload, one upload
// started (the body cannot rewind: only the completion was retried).
func TestCompleteDroppedIsRetriedAndRecognised(t *testing.T) {
	for name, b := range map[string]faultproxy.Break{
		"reset before the server acted":            faultproxy.Reset,
		"stall before the server acted":            faultproxy.Stall,
		"body cut after the server acted":          faultproxy.CutBody,
		"answer stalled after the server acted":    faultproxy.StallResponse,
		"broken headers before the server acted":   faultproxy.BrokenHeaders,
		"server's 503 (it did not act)":            faultproxy.NoBreak,
		"create-if-absent, cut after it acted":     faultproxy.CutBody,
		"create-if-absent, stalled after it acted": faultproxy.StallResponse,
	} {
		t.Run(name, func(t *testing.T) {
			ifNotExists := bytes.HasPrefix([]byte(name), []byte("create-if-absent"))
			st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
			st = st.WithStallTimeout(time.Second)
			complete := p.Add(&faultproxy.Rule{Match: isComplete, Fail: func(n int) bool { return n == 0 }, Break: b,
				Status: http.StatusServiceUnavailable, Body: slowDown})
			creates := p.Add(&faultproxy.Rule{Match: isCreateUpload, Fail: func(int) bool { return false }})
			data := randomBytes(12 << 20)
			ctx := context.Background()
			src := struct{ io.Reader }{bytes.NewReader(data)} // no Seek: the Store cannot restart the Put
			require.NoError(t, st.Put(ctx, "big", int64(len(data)), src, backend.PutOptions{IfNotExists: ifNotExists}))
			assert.Equal(t, 1, p.Failed(complete), "the first completion failed")
			assert.Equal(t, 2, p.Count(complete), "completions sent")
			assert.Equal(t, 1, p.Count(creates), "multipart uploads started")
			p.Clear()
			got, err := st.ReadAll(ctx, "big", 0)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got), "the object holds the bytes")
			var keys []string
			require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil }))
			assert.Equal(t, []string{"big"}, keys, "exactly one object")
			noIncompleteUploads(t, st)
		})
	}
}

// noSuchUpload is the answer of S3 to a completion of an upload it does
// not know (any more).
const noSuchUpload = `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchUpload</Code><Message>The specified upload does not exist.</Message></Error>`

// versitygw, like AWS for a while, answers a repeated completion of an
// upload it completed with success; a server that has forgotten the upload
// answers NoSuchUpload (404), and a create-if-absent retry may meet 412.
// Here the proxy gives those answers to the retry of a completion whose
// answer was lost after the server acted: the object is recognised by its
// size and whole-object CRC32C as the commit of the lost attempt.
func TestCompleteRetryAnsweredUploadGoneIsRecognised(t *testing.T) {
	for name, answer := range map[string]struct {
		status int
		body   string
	}{
		"NoSuchUpload": {http.StatusNotFound, noSuchUpload},
		"412":          {http.StatusPreconditionFailed, preconditionFailed},
	} {
		t.Run(name, func(t *testing.T) {
			st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
			complete := p.Add(&faultproxy.Rule{Match: isComplete, Fail: func(n int) bool { return n < 2 },
				Breaks: []faultproxy.Break{faultproxy.CutBody, faultproxy.NoBreak}, Status: answer.status, Body: answer.body})
			data := randomBytes(12 << 20)
			ctx := context.Background()
			require.NoError(t, st.Put(ctx, "big", int64(len(data)), struct{ io.Reader }{bytes.NewReader(data)}, backend.PutOptions{IfNotExists: true}))
			assert.Equal(t, 2, p.Count(complete), "the lost completion and its retry")
			p.Clear()
			got, err := st.ReadAll(ctx, "big", 0)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got))
			noIncompleteUploads(t, st)
		})
	}
}

const preconditionFailed = `<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>`

// A completion that finds another writer's object at the key is not
// mistaken for ours: after a lost answer, the create-if-absent retry meets
// an object of another content and fails with ErrAlreadyExists, leaving
// that object as it was and no upload behind.
func TestCompleteRetryDoesNotClaimAnotherObject(t *testing.T) {
	st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
	ctx := context.Background()
	other := randomBytes(12 << 20)
	other[0] ^= 1
	// The first completion is dropped before the server sees it; meanwhile
	// another writer (straight to the server) commits an object of the
	// same size at the key.
	root, err := backend.Open(ctx, testURL(t))
	require.NoError(t, err)
	defer root.Close()
	writer, err := root.Sub(st.Prefix())
	require.NoError(t, err)
	p.Add(&faultproxy.Rule{Match: isComplete, Fail: func(n int) bool {
		if n == 0 {
			require.NoError(t, writer.PutBytes(ctx, "big", other, backend.PutOptions{}))
		}
		return n == 0
	}, Break: faultproxy.Reset})
	data := randomBytes(12 << 20)
	err = st.Put(ctx, "big", int64(len(data)), struct{ io.Reader }{bytes.NewReader(data)}, backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	p.Clear()
	got, err := st.ReadAll(ctx, "big", 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(other, got), "the other writer's object stays")
	noIncompleteUploads(t, st)
}

package s3_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/faultproxy"
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
			src := struct{ *bytes.Reader }{bytes.NewReader(data)} // no Seek: the Store cannot restart the Put
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
	err = st.Put(ctx, "big", int64(len(data)), struct{ *bytes.Reader }{bytes.NewReader(data)}, backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	p.Clear()
	got, err := st.ReadAll(ctx, "big", 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(other, got), "the other writer's object stays")
	noIncompleteUploads(t, st)
}

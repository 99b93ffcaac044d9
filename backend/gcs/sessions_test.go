package gcs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/gcs"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// blockingSource yields "at" bytes of an n-byte body, then waits until
// release is closed and fails.
type blockingSource struct {
	n, at, off int
	reached    chan struct{}
	release    chan struct{}
}

func (b *blockingSource) Read(p []byte) (int, error) {
	if b.off >= b.n {
		return 0, io.EOF
	}
	if b.off == b.at {
		close(b.reached)
		<-b.release
		return 0, errors.New("source gave up")
	}
	k := min(len(p), b.at-b.off)
	for i := range k {
		p[i] = 'x'
	}
	b.off += k
	return k, nil
}

// A resumable upload whose writer dies without cleaning up (here: every
// cancellation and marker deletion of the failing Put is cut, as a
// SIGKILL would cut them): its marker is listed as an incomplete upload,
// invisible to List and ListDelimited, and AbortUpload cancels its
// session at the server and removes the marker.
func TestAbandonedResumableUploadIsListedAndAborted(t *testing.T) {
	st, p := proxiedStore(t, "chunk_size", "256KiB")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, st.PutBytes(ctx, "step/done", []byte("small"), backend.PutOptions{}))

	cleanup := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool { return r.Method == http.MethodDelete }, Break: faultproxy.Reset})
	src := &blockingSource{n: 1 << 20, at: 512 << 10, reached: make(chan struct{}), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		errc <- st.Driver().Put(ctx, st.Prefix()+"step/big", 1<<20, src, backend.PutOptions{})
	}()
	<-src.reached
	// The session is open, its first chunks sent: the marker is there.
	us := storetest.Uploads(t, st)
	require.Len(t, us, 1)
	assert.Equal(t, "step/big", us[0].Key)
	assert.WithinDuration(t, time.Now(), us[0].Initiated, time.Minute)
	close(src.release)
	require.Error(t, <-errc)
	require.Positive(t, p.Failed(cleanup), "the writer's own clean-up was cut")
	p.Clear()

	us = storetest.Uploads(t, st)
	require.Len(t, us, 1, "the marker of the abandoned session stays")
	var listed []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error { listed = append(listed, o.Key); return nil }))
	assert.Equal(t, []string{"step/done"}, listed, "markers are not objects")
	listed = nil
	require.NoError(t, st.ListDelimited(ctx, "step/", func(o backend.ObjectInfo) error { listed = append(listed, o.Key); return nil }))
	assert.Equal(t, []string{"step/done"}, listed, "the marker level is not listed")

	cancels := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		return r.Method == http.MethodDelete && r.URL.Query().Has("upload_id")
	}, Fail: func(int) bool { return false }})
	require.NoError(t, st.AbortUpload(ctx, us[0].Key, us[0].ID))
	assert.Equal(t, 1, p.Count(cancels), "the session was cancelled at the server")
	assert.Empty(t, storetest.Uploads(t, st))
	require.NoError(t, st.AbortUpload(ctx, us[0].Key, us[0].ID), "aborting an upload that is gone is not an error")
	ok, err := st.Exists(ctx, "step/big")
	require.NoError(t, err)
	assert.False(t, ok)
}

// A completed resumable upload leaves no marker, and keys in the marker
// namespace cannot be written.
func TestMarkersAreReservedAndRemovedOnSuccess(t *testing.T) {
	st := openStore(t, "chunk_size", "256KiB")
	ctx := context.Background()
	data := bytes.Repeat([]byte("y"), 700<<10)
	require.NoError(t, st.PutBytes(ctx, "a/big", data, backend.PutOptions{}))
	assert.Empty(t, storetest.Uploads(t, st))
	got, err := st.ReadAll(ctx, "a/big", -1)
	require.NoError(t, err)
	assert.Equal(t, data, got)
	for _, k := range []string{gcs.MarkerDir + "/x/1", "a/" + gcs.MarkerDir + "/big/1", "a/" + gcs.MarkerDir} {
		err := st.PutBytes(ctx, k, []byte("z"), backend.PutOptions{})
		require.ErrorIs(t, err, backend.ErrInvalidKey, k)
		assert.True(t, strings.Contains(err.Error(), k), "the error names the key: %v", err)
	}
}

// Regression (found by the interrupted-copy test after the marker work):
// a Put cancelled while its marker was being written left the marker
// behind when the server stored it but the client, cancelled, never heard.
// The marker write now completes, and the Put, seeing its cancellation,
// cancels the session and deletes the marker: nothing stays recorded.
func TestCancelDuringMarkerWriteLeavesNoMarker(t *testing.T) {
	st, p := proxiedStore(t, "chunk_size", "256KiB")
	seen := make(chan struct{}, 1)
	p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		return isUpload(r) && r.Method == http.MethodPost && r.URL.Query().Get("uploadType") == "multipart"
	}, Fail: func(int) bool { return false }, Delay: 300 * time.Millisecond, Seen: seen})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-seen // the marker write has reached the server; cancel before its answer
		cancel()
	}()
	err := st.PutBytes(ctx, "big", bytes.Repeat([]byte("m"), 1<<20), backend.PutOptions{})
	require.ErrorIs(t, err, context.Canceled)
	p.Clear()
	assert.Empty(t, storetest.Uploads(t, st), "no marker is left")
}

package stall_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/stall"
)

// A server that sends the header and half of the body and then goes
// silent: the read waiting on the body fails after the stall timeout with
// a StallError saying so; a server that never answers fails the request
// itself. Without a stall timeout in the context the default applies;
// with 0, nothing is watched.
func TestStalls(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/silent" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Length", "1000")
		_, _ = w.Write(make([]byte, 500))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	client := &http.Client{Transport: stall.Wrap(http.DefaultTransport)}
	const d = 200 * time.Millisecond
	ctx := backend.ContextWithStallTimeout(context.Background(), d)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/half?secret=x", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	start := time.Now()
	_, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var se *backend.StallError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "receiving the response body", se.Waiting)
	assert.Equal(t, "GET "+srv.URL+"/half", se.Request, "the query is left out")
	assert.Equal(t, d, se.Waited)
	assert.GreaterOrEqual(t, time.Since(start), d)

	req, err = http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/silent", nil)
	require.NoError(t, err)
	_, err = client.Do(req)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "waiting for the response", se.Waiting)
	assert.ErrorIs(t, err, backend.ErrTransient)
	assert.NotErrorIs(t, err, context.Canceled)

	assert.Equal(t, backend.DefaultStallTimeout, backend.StallTimeout(context.Background()))
	assert.Zero(t, backend.StallTimeout(backend.ContextWithStallTimeout(ctx, 0)))
}

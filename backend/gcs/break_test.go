package gcs_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
)

// Regression (issue 16): a connection reset, a reset inside the response
// headers and a body cut short were not transient on GCS either. The
// first broken upload is retried; so is the first broken download (object
// reads go through the proxy too: the emulator serves them on any port of
// its public host, see scripts/test-servers.sh), with the bytes intact,
// while a range past the end stays a short object, not a transient error.
func TestBrokenConnectionsAreRetried(t *testing.T) {
	for name, b := range map[string]faultproxy.Break{
		"reset":          faultproxy.Reset,
		"broken headers": faultproxy.BrokenHeaders,
		"cut body":       faultproxy.CutBody,
	} {
		t.Run(name, func(t *testing.T) {
			st, p := proxiedStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
			up := p.Add(&faultproxy.Rule{Match: isUpload, Fail: func(n int) bool { return n == 0 }, Break: b})
			require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}), "a broken upload is retried")
			assert.GreaterOrEqual(t, p.Count(up), 2)

			get := p.Add(&faultproxy.Rule{Match: isDownloadOf(st, "obj"), Fail: func(n int) bool { return n == 0 }, Break: b})
			buf := make([]byte, 1000)
			require.NoError(t, st.ReadRange(ctx, "obj", 500, buf), "a broken download is retried")
			assert.Equal(t, data[500:1500], buf)
			assert.Equal(t, 2, p.Count(get), "the broken download and its retry reached the proxy")
			err := st.ReadRange(ctx, "obj", int64(len(data))-10, buf)
			require.Error(t, err)
			require.NotErrorIs(t, err, backend.ErrTransient)
		})
	}
}

// isDownloadOf matches a media download of key under st: the client reads
// object bytes from the XML host as GET /<bucket>/<object>.
func isDownloadOf(st *backend.Store, key string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/storage/v1/") &&
			strings.HasSuffix(r.URL.Path, "/"+st.Prefix()+key)
	}
}

// A create-if-absent write (a checkpoint's commit) whose response is cut
// after the emulator stored the object: the retry meets the precondition
// (412), and the Store, finding its own bytes there, reports the commit as
// done, for a single-request upload and for the last chunk of a resumable
// one. Another writer's bytes at the key stay an AlreadyExists.
func TestCommitWithLostResponseIsCommitted(t *testing.T) {
	for name, size := range map[string]int{"single request": 1000, "resumable": 600 << 10} {
		t.Run(name, func(t *testing.T) {
			st, p := proxiedStore(t, "chunk_size", "256KiB")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 13)
			}
			// The request that completes the object: the only upload
			// request, or the resumable session's last chunk.
			last := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
				return isUpload(r) && (size < 256<<10 || strings.HasSuffix(r.Header.Get("Content-Range"), "/"+strconv.Itoa(size)))
			}, Fail: func(n int) bool { return n == 0 }, Break: faultproxy.CutBody})
			require.NoError(t, st.PutBytes(ctx, "commit", data, backend.PutOptions{IfNotExists: true}))
			require.Equal(t, 1, p.Failed(last), "the completing request's response was lost once")
			got, err := st.ReadAll(ctx, "commit", -1)
			require.NoError(t, err)
			assert.Equal(t, data, got)
			p.Clear()
			other := append([]byte{}, data...)
			other[0] ^= 1
			err = st.PutBytes(ctx, "commit", other, backend.PutOptions{IfNotExists: true})
			require.ErrorIs(t, err, backend.ErrAlreadyExists)
		})
	}
}

package gcs_test

import (
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
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// isFinalChunk matches the request that finalizes a resumable upload of
// size bytes: the chunk whose Content-Range ends with the total.
func isFinalChunk(size int) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return isSessionRequest(r) && r.Method != http.MethodDelete && strings.HasSuffix(r.Header.Get("Content-Range"), "/"+strconv.Itoa(size))
	}
}

// Issue 30 item 1 on GCS: the final request of a resumable upload, its
// connection dropped or stalled before the emulator acted and after it
// acted (the answer lost), plain and create-if-absent. The Put is retried
// under the Store's policy from its rewound source (the GCS client cannot
// resume a session the driver gave up on); a retry that meets the object
// committed by the attempt whose answer was lost recognises its own bytes
// (create-if-absent), a plain one rewrites the same bytes. Each case ends
// with exactly one object holding the bytes and no session marker left.
func TestFinalChunkDroppedIsRetriedAndRecognised(t *testing.T) {
	const size = 600 << 10
	for _, ifNotExists := range []bool{false, true} {
		for name, b := range map[string]faultproxy.Break{
			"reset before the server acted":         faultproxy.Reset,
			"stall before the server acted":         faultproxy.Stall,
			"body cut after the server acted":       faultproxy.CutBody,
			"answer stalled after the server acted": faultproxy.StallResponse,
		} {
			if ifNotExists {
				name = "create-if-absent, " + name
			}
			t.Run(name, func(t *testing.T) {
				st, p := proxiedStore(t, "chunk_size", "256KiB")
				st = st.WithStallTimeout(time.Second)
				ctx := context.Background()
				data := make([]byte, size)
				for i := range data {
					data[i] = byte(i * 7)
				}
				final := p.Add(&faultproxy.Rule{Match: isFinalChunk(size), Fail: func(n int) bool { return n == 0 }, Break: b})
				require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{IfNotExists: ifNotExists}))
				assert.Equal(t, 1, p.Failed(final), "the final request failed once")
				p.Clear()
				got, err := st.ReadAll(ctx, "obj", -1)
				require.NoError(t, err)
				assert.Equal(t, data, got)
				var keys []string
				require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil }))
				assert.Equal(t, []string{"obj"}, keys, "exactly one object")
				assert.Empty(t, storetest.Uploads(t, st), "no session marker left")
			})
		}
	}
}

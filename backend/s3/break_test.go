package s3_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
)

func isGetOf(key string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == http.MethodGet && len(r.URL.Path) > len(key) && r.URL.Path[len(r.URL.Path)-len(key)-1:] == "/"+key
	}
}

// Regression (issue 16): with a proxy breaking connections, an early EOF
// ("connection closed by foreign host"), a reset and a reset during the
// response headers ("malformed MIME header") were not classified
// transient, so the Store did not retry them and a save or load failed.
// Each break of the first request is now retried and the call succeeds.
func TestBrokenConnectionsAreRetried(t *testing.T) {
	for name, b := range map[string]faultproxy.Break{
		"reset":          faultproxy.Reset,
		"broken headers": faultproxy.BrokenHeaders,
		"cut body":       faultproxy.CutBody,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st, p := proxiedStore(t)
			data := randomBytes(64 << 10)
			put := p.Add(&faultproxy.Rule{Match: isPutOf("obj"), Fail: func(n int) bool { return n == 0 }, Break: b})
			require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}), "a broken PUT is retried")
			assert.Equal(t, 2, p.Count(put))
			get := p.Add(&faultproxy.Rule{Match: isGetOf("obj"), Fail: func(n int) bool { return n == 0 }, Break: b})
			got, err := st.ReadAll(ctx, "obj", 1<<20)
			require.NoError(t, err, "a broken GET is retried")
			assert.Equal(t, data, got)
			assert.Equal(t, 2, p.Count(get))
		})
	}
}

// A break that persists is transient to the end: one class, one exit code.
func TestPersistentBreakIsTransient(t *testing.T) {
	for name, b := range map[string]faultproxy.Break{"reset": faultproxy.Reset, "broken headers": faultproxy.BrokenHeaders, "cut body": faultproxy.CutBody} {
		t.Run(name, func(t *testing.T) {
			st, p := proxiedStore(t)
			require.NoError(t, st.PutBytes(context.Background(), "obj", randomBytes(1<<10), backend.PutOptions{}))
			p.Add(&faultproxy.Rule{Match: isGetOf("obj"), Break: b})
			_, err := st.ReadAll(context.Background(), "obj", 1<<20)
			require.ErrorIs(t, err, backend.ErrTransient)
		})
	}
}

// Regression (issue 16, found by the campaign): a ranged read whose body
// was cut after the response announced the whole range was reported as an
// object shorter than the range, a bad checkpoint ("data object named by
// the metadata is missing"), and not retried. It is transient now.
func TestCutRangeReadIsRetried(t *testing.T) {
	ctx := context.Background()
	st, p := proxiedStore(t)
	data := randomBytes(64 << 10)
	require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}))
	get := p.Add(&faultproxy.Rule{Match: isGetOf("obj"), Fail: func(n int) bool { return n == 0 }, Break: faultproxy.CutBody})
	buf := make([]byte, 1000)
	require.NoError(t, st.ReadRange(ctx, "obj", 500, buf))
	assert.Equal(t, data[500:1500], buf)
	assert.Equal(t, 2, p.Count(get))
	// A range past the end of the object is still a short object.
	err := st.ReadRange(ctx, "obj", int64(len(data))-10, buf)
	require.Error(t, err)
	require.NotErrorIs(t, err, backend.ErrTransient)
}

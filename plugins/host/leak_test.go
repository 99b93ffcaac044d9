//go:build unix

package host_test

import (
	"context"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/host"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNoGoroutineLeak runs a plugin through calls, a crash and a restart,
// closes it, and checks the host is back to its goroutine count.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	fdsBefore := openFDs(t)
	ps, err := host.Discover(context.Background(), host.Config{Dir: pluginDir(t, "memplugin"), Logger: hclog.NewNullLogger()})
	require.NoError(t, err)
	st, err := backend.Open(context.Background(), "memplug://leak/x")
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "k", []byte("v"), backend.PutOptions{}))
	rc, err := st.NewRangeReader(ctx, "k", 0, -1)
	require.NoError(t, err)
	require.NoError(t, rc.Close()) // abandoned before EOF
	require.NoError(t, st.List(ctx, "", func(backend.ObjectInfo) error { return nil }))
	// A crash and a restart.
	require.NoError(t, syscall.Kill(ps[0].PID(), syscall.SIGKILL))
	require.Eventually(t, func() bool { return ps[0].PID() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, st.PutBytes(ctx, "k2", []byte("v"), backend.PutOptions{}))
	assert.Equal(t, 1, ps[0].Restarts())
	ps[0].Close()
	require.NoError(t, st.Close())
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left behind")
	if fdsBefore >= 0 {
		assert.LessOrEqual(t, openFDs(t), fdsBefore, "descriptors (sockets, shared-memory segments) left open")
	}
	if t.Failed() {
		buf := make([]byte, 1<<20)
		t.Log(string(buf[:runtime.Stack(buf, true)]))
	}
}

// openFDs counts the process's open descriptors, -1 where /proc is absent.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

//go:build unix

package host_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/host"
)

// CKPTKIT_PLUGIN_FORCE_STREAMING is taken from the environment Discover's
// context carries (the C ABI's open passes the caller's of the moment),
// not from the process environment.
func TestForceStreamingFromTheEnvironmentOfTheContext(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory path is Linux only")
	}
	t.Setenv(host.EnvForceStreaming, "")
	for _, forced := range []bool{false, true} {
		env := map[string]string{}
		name := "envshmfs"
		if forced {
			env[host.EnvForceStreaming] = "1"
			name = "envstreamfs"
		}
		ctx := backend.WithEnv(context.Background(), env)
		ps, err := host.Discover(ctx, host.Config{Dir: pluginDir(t, name)})
		require.NoError(t, err)
		require.Len(t, ps, 1)
		on, err := host.UsesSharedMemory(ctx, ps[0])
		ps[0].Close()
		require.NoError(t, err)
		require.Equal(t, !forced, on, "shared memory with %s=%q in the context's environment", host.EnvForceStreaming, env[host.EnvForceStreaming])
	}
}

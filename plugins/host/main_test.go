//go:build unix

package host_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/plugins/host"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/require"
)

// memplugin is the example plugin, built once per test binary.
var memplugin string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperHost()
		return
	}
	dir, err := os.MkdirTemp("", "ckptkit-plugin-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	memplugin = filepath.Join(dir, "memplugin")
	cmd := exec.Command("go", "build", "-o", memplugin, "github.com/ckptkit/ckptkit/plugins/examples/memplugin")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building memplugin:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	conformance.ReportSummary()
	host.CloseAll()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pluginDir returns a fresh directory holding a copy of memplugin under
// each of names.
func pluginDir(t testing.TB, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		copyFile(t, memplugin, filepath.Join(dir, n))
	}
	return dir
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// discover runs host.Discover and closes the plugins when the test ends.
func discover(t testing.TB, cfg host.Config) []*host.Plugin {
	t.Helper()
	ps, err := host.Discover(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, p := range ps {
			p.Close()
		}
	})
	for _, p := range ps {
		on, err := host.UsesSharedMemory(context.Background(), p)
		require.NoError(t, err)
		forced := cfg.ForceStreaming || os.Getenv(host.EnvForceStreaming) == "1"
		require.Equal(t, runtime.GOOS == "linux" && !forced, on, "shared-memory path negotiated")
	}
	return ps
}

// bothPaths runs test over the shared-memory bulk path (every body size
// included) and with streaming forced.
func bothPaths(t *testing.T, test func(t *testing.T, streaming bool)) {
	t.Run("shm", func(t *testing.T) {
		skipWithoutShm(t)
		t.Cleanup(host.SetShmThreshold(0))
		test(t, false)
	})
	t.Run("streaming", func(t *testing.T) { test(t, true) })
}

// logBuffer is a concurrency-safe log sink.
type logBuffer = ckpttest.SyncBuffer

func testLogger(w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: w})
}

// skipWithoutShm skips tests of the shared-memory path where it is off.
func skipWithoutShm(t *testing.T) {
	if runtime.GOOS != "linux" || os.Getenv(host.EnvForceStreaming) == "1" {
		t.Skip("shared-memory bulk path unavailable or disabled")
	}
}

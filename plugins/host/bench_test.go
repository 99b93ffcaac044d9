//go:build unix

package host_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/plugins/examples/memplugin/memstore"
	"github.com/ckptkit/ckptkit/plugins/host"
	"github.com/stretchr/testify/require"
)

// BenchmarkPluginThroughput puts and reads back a 64 MiB object through the
// memplugin process and through the same memstore driver in-process, and
// reports the plugin's throughput as a fraction of the in-process one
// ("plugin/inproc"; the target is >= 0.8) and both in MB/s. ns/op and MB/s
// are the plugin's.
func BenchmarkPluginThroughput(b *testing.B) {
	discover(b, host.Config{Dir: pluginDir(b, "memplugin")})
	remote := open(b, "memplug://bench/run")
	local, err := backend.NewStore(memstore.New(), "mem://bench", "run")
	require.NoError(b, err)
	measureRatio(b, remote, local)
}

// BenchmarkPluginThroughputFS compares backend/fs served by the fsplugin
// example with the same driver in process: a disk-backed driver (fsync on
// every object), where the process boundary is a share of real I/O rather
// than of a memcpy as with the in-memory store above.
func BenchmarkPluginThroughputFS(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "fsplugin")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/ckptkit/ckptkit/plugins/examples/fsplugin").CombinedOutput()
	require.NoError(b, err, "build fsplugin: %s", out)
	discover(b, host.Config{Dir: dir})
	remote := open(b, "localdir://"+filepath.ToSlash(b.TempDir()))
	local := open(b, b.TempDir())
	measureRatio(b, remote, local)
}

// measureRatio times put+read of a 64 MiB object through remote (a plugin)
// and local (the same driver in process) in the same iterations and
// reports plugin/inproc.
func measureRatio(b *testing.B, remote, local *backend.Store) {
	const size = 64 << 20
	data := randomBytes(size, 9)
	dst := make([]byte, size)
	ctx := context.Background()
	roundTrip := func(st *backend.Store) time.Duration {
		start := time.Now()
		require.NoError(b, st.Put(ctx, "obj", size, bytes.NewReader(data), backend.PutOptions{}))
		require.NoError(b, st.ReadRange(ctx, "obj", 0, dst))
		return time.Since(start)
	}
	roundTrip(remote) // warm up connection windows and caches
	roundTrip(local)

	b.SetBytes(2 * size)
	b.ResetTimer()
	var inproc, plugin time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		inproc += roundTrip(local)
		b.StartTimer()
		plugin += roundTrip(remote)
	}
	b.StopTimer()
	mb := float64(2*size*b.N) / 1e6
	b.ReportMetric(inproc.Seconds()/plugin.Seconds(), "plugin/inproc")
	b.ReportMetric(mb/inproc.Seconds(), "inproc-MB/s")
	require.True(b, bytes.Equal(data, dst), "the plugin returned other bytes")
}

package ckpttest

import (
	"context"
	"hash/crc32"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
	"github.com/ckptkit/ckptkit/metadata"
)

// CopyDir copies the regular files of src (hidden ones included) into dst.
func CopyDir(t testing.TB, src, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
}

// WithPath puts p after the path of a URL that may carry a query.
func WithPath(u, p string) string {
	base, query, ok := strings.Cut(u, "?")
	if ok {
		return strings.TrimSuffix(base, "/") + "/" + p + "?" + query
	}
	return strings.TrimSuffix(base, "/") + "/" + p
}

// SparseTensorCheckpoint commits in dir (a local directory) a checkpoint
// of one uint8 tensor "model.big" of n zero bytes in one chunk, whose data
// object "rank-00000-000.data" is a sparse file: a huge chunk that costs
// no disk.
func SparseTensorCheckpoint(t testing.TB, dir string, n int64) {
	t.Helper()
	SparseTensorCheckpointEndingIn(t, dir, n, 0)
}

// SparseTensorCheckpointEndingIn is SparseTensorCheckpoint with the last
// element of "model.big" set to last.
func SparseTensorCheckpointEndingIn(t testing.TB, dir string, n int64, last byte) {
	t.Helper()
	require.Positive(t, n)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	obj := "rank-00000-000.data"
	f, err := os.Create(filepath.Join(dir, obj))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(n))
	if last != 0 {
		_, err = f.WriteAt([]byte{last}, n-1)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	zeros := make([]byte, 1<<20)
	table := crc32.MakeTable(crc32.Castagnoli)
	var crc uint32
	for done := int64(0); done < n-1; done += int64(len(zeros)) {
		crc = crc32.Update(crc, table, zeros[:min(int64(len(zeros)), n-1-done)])
	}
	crc = crc32.Update(crc, table, []byte{last})
	md := &metadata.Checkpoint{WorldSize: 1, Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone},
		Tensors: []metadata.TensorEntry{{Key: "model.big", DType: "uint8", Shape: []int64{n},
			Chunks: []metadata.Chunk{{Offsets: []int64{0}, Sizes: []int64{n}, Object: obj, Length: n, CRC32C: crc}}}},
		Objects: []metadata.ObjectEntry{{Key: obj, Size: n}}}
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, metadata.ObjectKey), enc, 0o644))
}

// ProxiedS3 opens a store on a fresh prefix of the S3 test bucket through
// a fault-injecting proxy (internal/faultproxy), with policy as its retry
// policy; it skips the test when CKPTKIT_TEST_S3_URL is not set. The
// proxy's rules are cleared before the prefix is cleaned up.
func ProxiedS3(t testing.TB, policy backend.RetryPolicy) (*backend.Store, *faultproxy.Proxy) {
	t.Helper()
	raw := storetest.TestURL(t, S3URLEnv)
	u, err := url.Parse(raw)
	require.NoError(t, err)
	p, err := faultproxy.New("http://" + u.Query().Get("endpoint"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	q := u.Query()
	q.Set("endpoint", p.Host())
	u.RawQuery = q.Encode()
	root, err := backend.Open(context.Background(), u.String())
	require.NoError(t, err)
	st := storetest.Scratch(t, root)
	t.Cleanup(p.Clear) // runs before the scratch clean-up, which must pass
	return st.WithRetry(policy), p
}

// ProxiedGCS opens a store on a fresh prefix of the GCS test bucket through
// a fault-injecting proxy, with policy as its retry policy; it skips the
// test when CKPTKIT_TEST_GCS_URL or STORAGE_EMULATOR_HOST is not set. The
// driver finds the emulator by STORAGE_EMULATOR_HOST, so this sets it to
// the proxy for the rest of the test (t.Setenv: not in parallel tests);
// every request (JSON API, uploads and their sessions, media downloads)
// then goes through the proxy. The caller's binary must register the gs
// scheme (import backend/gcs). The proxy's rules are cleared before the
// prefix is cleaned up.
func ProxiedGCS(t testing.TB, policy backend.RetryPolicy) (*backend.Store, *faultproxy.Proxy) {
	t.Helper()
	raw, host := storetest.TestURL(t, GCSURLEnv), storetest.TestURL(t, "STORAGE_EMULATOR_HOST")
	p, err := faultproxy.New("http://" + strings.TrimPrefix(host, "http://"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	t.Setenv("STORAGE_EMULATOR_HOST", p.Host())
	root, err := backend.Open(context.Background(), raw)
	require.NoError(t, err)
	st := storetest.Scratch(t, root)
	t.Cleanup(p.Clear)
	return st.WithRetry(policy), p
}

// Package storetest holds test helpers shared by the tests of the object
// store drivers (backend/s3, backend/gcs): finding the test server's URL,
// scratch prefixes that clean up after themselves, a deterministic byte
// stream and readers that misbehave on purpose. Only tests import it.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/conformance"
)

// TestURL returns the URL of the test server named by the environment
// variable env, or skips the test (fails it on CI) when it is unset, that
// is when the test servers are not running.
func TestURL(t conformance.T, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		msg := env + ` is unset; start the test servers with: eval "$(scripts/test-servers.sh start)"`
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s", msg)
		}
		t.Skip(msg)
	}
	return u
}

// WithParams returns raw with the query parameters kv (name, value, name,
// value, ...) set.
func WithParams(t conformance.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Scratch returns a Store for a fresh random prefix below root. When the
// test ends it deletes every object below that prefix and closes root.
func Scratch(t conformance.T, root *backend.Store) *backend.Store {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	st, err := root.Sub("t-" + hex.EncodeToString(b[:]))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var keys []string
		_ = st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil })
		for _, k := range keys {
			assert.NoError(t, st.Delete(ctx, k))
		}
		_ = root.Close()
	})
	return st
}

// Gen is a cheap deterministic byte stream: the byte at position p is a
// function of (seed, p) alone, so ranges can be checked without storing data.
type Gen struct {
	seed uint64
	pos  int64
	size int64
}

// NewGen returns the first size bytes of the stream of seed.
func NewGen(seed uint64, size int64) *Gen { return &Gen{seed: seed, size: size} }

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Read implements io.Reader.
func (g *Gen) Read(p []byte) (int, error) {
	if g.pos >= g.size {
		return 0, io.EOF
	}
	if rem := g.size - g.pos; int64(len(p)) > rem {
		p = p[:rem]
	}
	n := 0
	for n < len(p) {
		word := uint64(g.pos+int64(n)) / 8
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], mix(g.seed^word))
		off := int(uint64(g.pos+int64(n)) % 8)
		n += copy(p[n:], w[off:])
	}
	g.pos += int64(n)
	return n, nil
}

// GenBytes returns bytes [off, off+n) of the stream of seed.
func GenBytes(seed uint64, off, n int64) []byte {
	g := &Gen{seed: seed, pos: off, size: off + n}
	b, _ := io.ReadAll(g)
	return b
}

// Castagnoli is the CRC32C table, the checksum the Store declares.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRCOf returns the CRC32C of everything r yields and how many bytes that was.
func CRCOf(r io.Reader) (uint32, int64, error) {
	h := crc32.New(Castagnoli)
	n, err := io.Copy(h, r)
	return h.Sum32(), n, err
}

// OnlyReader hides any io.Seeker (or other method) of r, so the Store cannot
// retry a write from it.
func OnlyReader(r io.Reader) io.Reader { return onlyReader{r} }

type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// HookReader reads R and calls Hook once, before the first read that starts
// at or after byte After. A Hook error ends that read. Done reports whether
// Hook ran.
type HookReader struct {
	R     io.Reader
	After int64
	Hook  func() error
	Done  bool
	read  int64
}

// Read implements io.Reader.
func (h *HookReader) Read(p []byte) (int, error) {
	if !h.Done && h.read >= h.After {
		h.Done = true
		if err := h.Hook(); err != nil {
			return 0, err
		}
	}
	n, err := h.R.Read(p)
	h.read += int64(n)
	return n, err
}

// ErrSource is the error of a FailingSource.
var ErrSource = ckpterr.New(ckpterr.Internal, "source exploded")

// FailingSource returns a reader that yields the first n bytes of r and
// then fails with ErrSource.
func FailingSource(r io.Reader, n int64) io.Reader { return &failingSource{r: r, n: n} }

type failingSource struct {
	r io.Reader
	n int64
}

func (f *failingSource) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, ErrSource
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

// ReadAll returns the whole content of key, failing the test on error.
func ReadAll(t conformance.T, st *backend.Store, key string) []byte {
	t.Helper()
	b, err := st.ReadAll(context.Background(), key, 0)
	require.NoError(t, err)
	return b
}

// AssertContent checks key holds want without dumping large bodies.
func AssertContent(t conformance.T, st *backend.Store, key string, want []byte) {
	t.Helper()
	got := ReadAll(t, st, key)
	assert.True(t, bytes.Equal(want, got), "%s: got %d bytes, want %d bytes %q", key, len(got), len(want), want)
}

// PutGen writes size generated bytes of seed to key from a non-seekable
// reader.
func PutGen(ctx context.Context, st *backend.Store, key string, seed uint64, size int64, opts backend.PutOptions) error {
	return st.Put(ctx, key, size, OnlyReader(NewGen(seed, size)), opts)
}

// CheckGen verifies key holds size generated bytes of seed, streaming.
func CheckGen(t conformance.T, st *backend.Store, key string, seed uint64, size int64) {
	t.Helper()
	ctx := context.Background()
	attrs, err := st.Stat(ctx, key)
	require.NoError(t, err)
	require.Equal(t, size, attrs.Size)
	want, _, err := CRCOf(NewGen(seed, size))
	require.NoError(t, err)
	rc, err := st.NewRangeReader(ctx, key, 0, -1)
	require.NoError(t, err)
	defer rc.Close()
	got, n, err := CRCOf(rc)
	require.NoError(t, err)
	require.Equal(t, size, n)
	require.Equal(t, want, got, "content CRC32C")
}

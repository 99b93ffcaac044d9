package fs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/fs"
)

// fsStore opens a Store on a fresh directory.
func fsStore(t *testing.T) (*backend.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := backend.Open(context.Background(), "file://"+dir)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st, dir
}

// parts returns n pseudo-random slices of the given lengths.
func parts(lengths ...int) [][]byte {
	out := make([][]byte, len(lengths))
	x := uint32(12345)
	for i, n := range lengths {
		out[i] = make([]byte, n)
		for j := range out[i] {
			x = x*1664525 + 1013904223
			out[i][j] = byte(x >> 24)
		}
	}
	return out
}

func joined(ps [][]byte) []byte { return bytes.Join(ps, nil) }

// writeOnly is a SlicesReader whose Read fails: a Put of it succeeds only
// if the driver takes the bytes through WriteTo.
type writeOnly struct{ *backend.SlicesReader }

var errReadCalled = errors.New("Read called: the body was copied through a buffer")

func (writeOnly) Read([]byte) (int, error) { return 0, errReadCalled }

// streamTap is a backend.PieceTap that rebuilds the stream from the pieces
// it is handed (each at its position), so a test sees that the tap got
// every byte, in place, in cache-sized pieces.
type streamTap struct {
	got      []byte
	seen     []bool
	maxPiece int
}

func newStreamTap(size int) *streamTap {
	return &streamTap{got: make([]byte, size), seen: make([]bool, size)}
}

func (s *streamTap) Piece(pos int64, b []byte) {
	copy(s.got[pos:], b)
	for i := range b {
		s.seen[int(pos)+i] = true
	}
	s.maxPiece = max(s.maxPiece, len(b))
}

func (s *streamTap) check(t *testing.T, want []byte) {
	t.Helper()
	for i, ok := range s.seen {
		require.True(t, ok, "byte %d never reached the tap", i)
	}
	require.True(t, bytes.Equal(want, s.got), "the tap saw other bytes than the stream")
	require.LessOrEqual(t, s.maxPiece, 256<<10, "pieces small enough to stay in the cache")
}

// The fs driver writes a SlicesReader's parts straight to the file (no
// copy buffer), every byte lands where it belongs, and every piece reaches
// the reader's tap on the way.
func TestPutWritesTheCallersSlices(t *testing.T) {
	ctx := context.Background()
	st, dir := fsStore(t)
	ps := parts(5, 300<<10, 0, 4096, 9<<20+3, 1)
	want := joined(ps)
	tap := newStreamTap(len(want))
	src := backend.NewSlicesReader(ps).Tap(tap)
	require.NoError(t, st.Put(ctx, "run/step-1/obj", int64(len(want)), writeOnly{src}, backend.PutOptions{}))

	got, err := os.ReadFile(filepath.Join(dir, "run", "step-1", "obj"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "stored bytes differ")
	tap.check(t, want)
}

// A declared size that differs from what the slices hold is refused
// before anything is written, and nothing is published.
func TestPutWriterToSizeMismatch(t *testing.T) {
	ctx := context.Background()
	st, _ := fsStore(t)
	ps := parts(1000, 24)
	for _, declared := range []int64{1023, 1025, 1} {
		err := st.Put(ctx, "k", declared, writeOnly{backend.NewSlicesReader(ps)}, backend.PutOptions{})
		require.ErrorIs(t, err, backend.ErrSizeMismatch, "declared %d", declared)
		ok, err := st.Exists(ctx, "k")
		require.NoError(t, err)
		require.False(t, ok, "declared %d: published", declared)
	}
}

// cancelAfterFirstWrite is a source that cancels the Put's context as
// soon as its first piece has been written.
type cancelAfterFirstWrite struct {
	*backend.SlicesReader
	cancel context.CancelFunc
}

type cancellingWriter struct {
	w      io.Writer
	cancel context.CancelFunc
}

func (c cancellingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.cancel()
	return n, err
}

func (c cancelAfterFirstWrite) WriteTo(w io.Writer) (int64, error) {
	return c.SlicesReader.WriteTo(cancellingWriter{w: w, cancel: c.cancel})
}

// A Put cancelled between two writes of its body stops there, reports the
// cancellation and publishes nothing.
func TestCancelledWriteToNeverPublishes(t *testing.T) {
	st, dir := fsStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := parts(20 << 20)
	src := cancelAfterFirstWrite{SlicesReader: backend.NewSlicesReader(ps), cancel: cancel}
	err := st.Put(ctx, "k", 20<<20, src, backend.PutOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, src.Len(), 20<<20-8<<20+1, "stopped after one piece")
	require.Greater(t, src.Len(), 0, "stopped before the end")
	ok, err := st.Exists(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, ok)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		require.NotContains(t, e.Name(), fs.TempPrefix, "temporary file left behind")
	}
}

var errCut = errors.New("device went away for a moment")

// cutOnce fails the first Put of each object after writing part of its
// body through WriteTo (to the real file system, under another key),
// transiently: the Store must rewind the body and write it again.
type cutOnce struct {
	backend.Driver
	cut atomic.Int32
}

type cutWriter struct {
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.left {
		n := c.left
		c.left = 0
		return n, errCut
	}
	c.left -= len(p)
	return len(p), nil
}

func (c *cutOnce) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if c.cut.Add(1) == 1 {
		wt, ok := r.(io.WriterTo)
		if !ok {
			return errors.New("the Store's body has no WriteTo")
		}
		_, err := wt.WriteTo(&cutWriter{left: 300<<10 + 17})
		return err
	}
	return c.Driver.Put(ctx, key, size, r, opts)
}

func (c *cutOnce) ErrorCode(err error) backend.Code {
	if errors.Is(err, errCut) {
		return backend.CodeTransient
	}
	return c.Driver.ErrorCode(err)
}

// A write cut halfway is retried by the Store from the start of the body:
// the object holds exactly the slices and the item CRCs are right.
func TestWriterToRetryRewindsTheBody(t *testing.T) {
	ctx := context.Background()
	st, _ := fsStore(t)
	ps := parts(100<<10, 700<<10, 3)
	want := joined(ps)
	tap := newStreamTap(len(want))
	src := backend.NewSlicesReader(ps).Tap(tap)
	cut := &cutOnce{Driver: st.Driver()}
	require.NoError(t, st.WithDriver(cut).Put(ctx, "obj", int64(len(want)), src, backend.PutOptions{}))
	require.EqualValues(t, 2, cut.cut.Load(), "one cut attempt, one retry")
	got, err := st.ReadAll(ctx, "obj", 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "stored bytes differ")
	tap.check(t, want)
}

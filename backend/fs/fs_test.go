package fs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

func list(t *testing.T, s *backend.Store) []string {
	t.Helper()
	keys := []string{}
	require.NoError(t, s.List(context.Background(), "", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}))
	return keys
}

func TestURLsAndPlainPathsShareData(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "new", "root") // created on open
	a := storetest.Open(t, "file://"+filepath.ToSlash(dir))
	require.NoError(t, a.PutBytes(ctx, "x/y", []byte("hello"), backend.PutOptions{}))

	b := storetest.Open(t, dir)
	got, err := b.ReadAll(ctx, "x/y", 0)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	assert.Equal(t, "file://"+filepath.ToSlash(dir), b.String())

	raw, err := os.ReadFile(filepath.Join(dir, "x", "y"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(raw), "objects are plain files")

	_, err = backend.Open(ctx, "file://otherhost/tmp/x")
	assert.ErrorIs(t, err, backend.ErrUnsupported)
}

// setupEscape returns a store rooted in a directory holding symbolic links
// that point out of it, and the outside directory.
func setupEscape(t *testing.T) (*backend.Store, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	require.NoError(t, os.MkdirAll(root, 0o755))
	require.NoError(t, os.MkdirAll(outside, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "abslink")))
	require.NoError(t, os.Symlink("../outside/secret", filepath.Join(root, "rellink")))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "dirlink")))
	require.NoError(t, os.Symlink("../outside", filepath.Join(root, "reldirlink")))
	return storetest.Open(t, root), outside
}

func TestSymlinksOutOfRootAreRefused(t *testing.T) {
	ctx := context.Background()
	s, outside := setupEscape(t)
	refused := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		assert.ErrorIs(t, err, backend.ErrPermission)
		assert.NotErrorIs(t, err, backend.ErrNotFound)
	}
	for _, key := range []string{"abslink", "rellink", "dirlink/secret", "reldirlink/secret"} {
		t.Run(key, func(t *testing.T) {
			_, err := s.Stat(ctx, key)
			refused(t, err)
			_, err = s.NewRangeReader(ctx, key, 0, -1)
			refused(t, err)
			_, err = s.ReadAll(ctx, key, 0)
			refused(t, err)
		})
	}
	for _, key := range []string{"dirlink/new", "reldirlink/new", "dirlink/secret", "dirlink/sub/new"} {
		err := s.PutBytes(ctx, key, []byte("pwned"), backend.PutOptions{})
		refused(t, err)
		err = s.PutBytes(ctx, key, []byte("pwned"), backend.PutOptions{IfNotExists: true})
		refused(t, err)
		err = s.Delete(ctx, key)
		refused(t, err)
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing was written outside the root")
	raw, err := os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "secret", string(raw))

	assert.Empty(t, list(t, s), "listing does not follow links out of the root")
	err = s.List(ctx, "dirlink/", func(o backend.ObjectInfo) error {
		t.Errorf("listed %q through a link out of the root", o.Key)
		return nil
	})
	refused(t, err)

	// Deleting a link removes the link, never its target.
	require.NoError(t, s.Delete(ctx, "abslink"))
	_, err = os.Stat(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	// Overwriting a link replaces the link inside the root.
	require.NoError(t, s.PutBytes(ctx, "rellink", []byte("mine"), backend.PutOptions{}))
	raw, err = os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "secret", string(raw))
}

func TestSymlinksInsideRootWork(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := storetest.Open(t, root)
	require.NoError(t, s.PutBytes(ctx, "real/obj", []byte("data"), backend.PutOptions{}))
	require.NoError(t, os.Symlink("real/obj", filepath.Join(root, "alias")))
	got, err := s.ReadAll(ctx, "alias", 0)
	require.NoError(t, err)
	assert.Equal(t, "data", string(got))
	assert.Equal(t, []string{"alias", "real/obj"}, list(t, s))
}

func TestTempFilesAreHidden(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := storetest.Open(t, root)
	require.NoError(t, s.PutBytes(ctx, "d/obj", []byte("x"), backend.PutOptions{}))
	// Litter from a crashed writer.
	require.NoError(t, os.WriteFile(filepath.Join(root, fs.TempPrefix+"crash"), []byte("junk"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "d", fs.TempPrefix+"crash"), []byte("junk"), 0o644))
	assert.Equal(t, []string{"d/obj"}, list(t, s))

	err := s.PutBytes(ctx, "d/"+fs.TempPrefix+"mine", []byte("x"), backend.PutOptions{})
	assert.ErrorIs(t, err, backend.ErrInvalidKey)
}

func TestDeleteRemovesEmptyParents(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := storetest.Open(t, root)
	require.NoError(t, s.PutBytes(ctx, "a/b/c/d", []byte("1"), backend.PutOptions{}))
	require.NoError(t, s.PutBytes(ctx, "a/keep", []byte("2"), backend.PutOptions{}))
	require.NoError(t, s.Delete(ctx, "a/b/c/d"))
	_, err := os.Stat(filepath.Join(root, "a", "b"))
	assert.ErrorIs(t, err, os.ErrNotExist, "empty parents are removed")
	_, err = os.Stat(filepath.Join(root, "a", "keep"))
	assert.NoError(t, err)

	require.NoError(t, s.Delete(ctx, "a/keep"))
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	assert.Empty(t, entries)
	_, err = os.Stat(root)
	assert.NoError(t, err, "the root itself stays")

	// A directory is not an object: deleting its name removes nothing.
	require.NoError(t, s.PutBytes(ctx, "x/y", []byte("1"), backend.PutOptions{}))
	require.NoError(t, s.Delete(ctx, "x"))
	assert.Equal(t, []string{"x/y"}, list(t, s))
}

func TestFileDirectoryConflict(t *testing.T) {
	ctx := context.Background()
	s := storetest.Open(t, t.TempDir())
	require.NoError(t, s.PutBytes(ctx, "a", []byte("file"), backend.PutOptions{}))
	err := s.PutBytes(ctx, "a/b", []byte("x"), backend.PutOptions{})
	require.Error(t, err)
	assert.NotErrorIs(t, err, backend.ErrNotFound)
	_, err = s.Stat(ctx, "a/b")
	assert.ErrorIs(t, err, backend.ErrNotFound)

	require.NoError(t, s.PutBytes(ctx, "d/e", []byte("x"), backend.PutOptions{}))
	err = s.PutBytes(ctx, "d", []byte("x"), backend.PutOptions{})
	require.Error(t, err)
	assert.NotErrorIs(t, err, backend.ErrNotFound)
	assert.Equal(t, []string{"a", "d/e"}, list(t, s))
}

func TestErrorCode(t *testing.T) {
	d, err := fs.New(t.TempDir())
	require.NoError(t, err)
	defer d.Close()
	ctx := context.Background()
	_, err = d.Stat(ctx, "missing")
	assert.Equal(t, backend.CodeNotFound, d.ErrorCode(err))
	assert.Equal(t, backend.CodeCanceled, d.ErrorCode(context.Canceled))
	assert.Equal(t, backend.CodePermission, d.ErrorCode(os.ErrPermission))
	assert.Equal(t, backend.CodeAlreadyExists, d.ErrorCode(os.ErrExist))
	assert.Equal(t, backend.CodeUnknown, d.ErrorCode(os.ErrClosed))
}

// Regression: opening a missing directory (to verify or inspect it) must
// not create it; the first write does.
func TestOpenMissingDirCreatesNothingUntilWrite(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "not", "yet")
	st, err := backend.Open(ctx, dir)
	require.NoError(t, err)
	_, err = st.Stat(ctx, "k")
	require.ErrorIs(t, err, backend.ErrNotFound)
	require.NoError(t, st.List(ctx, "", func(backend.ObjectInfo) error { return errors.New("listed something") }))
	require.NoError(t, st.Delete(ctx, "k"))
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "a read-only open created the directory")
	require.NoError(t, st.PutBytes(ctx, "a/k", []byte("x"), backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "a/k", 0)
	require.NoError(t, err)
	require.Equal(t, []byte("x"), got)
}

// Regression (review): a directory deleted while a listing walked toward it
// failed the whole listing (ckpt ls/latest/gc racing another gc).
func TestListToleratesDirectoriesDeletedMeanwhile(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, t.TempDir())
	require.NoError(t, err)
	for i := 0; i < 40; i++ {
		require.NoError(t, st.PutBytes(ctx, fmt.Sprintf("step-%02d/rank.data", i), []byte("x"), backend.PutOptions{}))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 40; i++ {
			_ = st.Delete(ctx, fmt.Sprintf("step-%02d/rank.data", i))
		}
	}()
	for listing := true; listing; {
		select {
		case <-done:
			listing = false
		default:
		}
		require.NoError(t, st.List(ctx, "", func(backend.ObjectInfo) error { return nil }))
	}
}

// Regression (issue 16): a FIFO at a key made a read block forever waiting
// for a writer, and Stat called it "not found". Both now return at once
// with fs.ErrNotRegular (class bad-checkpoint), never not-found.
func TestFIFOIsNotAnObject(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, syscall.Mkfifo(filepath.Join(root, "pipe"), 0o644))
	st, err := backend.Open(context.Background(), root)
	require.NoError(t, err)
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = st.ReadAll(ctx, "pipe", 1<<20)
	require.ErrorIs(t, err, fs.ErrNotRegular)
	require.NotErrorIs(t, err, backend.ErrNotFound)
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	require.Contains(t, err.Error(), "named pipe")
	_, err = st.Stat(ctx, "pipe")
	require.ErrorIs(t, err, fs.ErrNotRegular)
	require.NoError(t, ctx.Err(), "returned at once")
}

// Package fs is the ckptkit driver for local directories: file:///abs/dir
// URLs and plain paths (which backend.ParseURL turns into file:// URLs).
//
// Every operation goes through an os.Root opened on the directory, so no key
// ever resolves outside it, symbolic links included: a link that points out
// of the root is refused with backend.CodePermission. Writes go to a hidden
// temporary file in the destination directory, are fsynced, then published by
// rename (or by hard link for create-if-absent), and the directory is fsynced.
// Temporary files a killed writer left are incomplete uploads (ListUploads,
// AbortUpload: what `ckpt gc` removes) and are removed by the next write
// into their directory once their writer is provably gone (temp.go).
//
// A file system that refuses an operation (full, over quota, read-only, no
// permission) is backend.CodePermission, with a hint in the message
// (errno.go).
//
// Importing the package registers the "file" scheme.
package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bufpool"
)

// TempPrefix starts the name of every temporary file a Put creates. List
// never shows such files and Put refuses keys whose last segment starts
// with it.
const TempPrefix = ".ckptkit-tmp-"

func init() {
	backend.MustRegister("file", Open)
}

// Open is the backend.Opener for file:// URLs. The URL path is the root
// directory, created by the first write (opening a missing directory to
// read or verify it creates nothing); the returned prefix is "". A host other
// than "" or "localhost" is refused.
func Open(_ context.Context, u *url.URL) (backend.Driver, string, error) {
	if u.Host != "" && u.Host != "localhost" {
		return nil, "", fmt.Errorf("file URL with host %q: only local paths are supported: %w", u.Host, backend.ErrUnsupported)
	}
	if u.Path == "" {
		return nil, "", fmt.Errorf("file URL without a path: %w", backend.ErrInvalidKey)
	}
	d, err := New(filepath.FromSlash(u.Path))
	if err != nil {
		return nil, "", err
	}
	return d, "", nil
}

// Driver is a backend.Driver rooted at a local directory.
type Driver struct {
	dir  string
	mu   sync.Mutex
	root *os.Root // nil until the directory exists
	// noCached is set once the file system refuses non-blocking
	// page-cache reads (see cachedReader); reads then always block.
	noCached atomic.Bool
	// swept holds the directories whose stale temporary files this
	// driver has removed (sweepDir: once per directory).
	swept sync.Map
}

var _ backend.Driver = (*Driver)(nil)

// New returns a driver rooted at dir. A missing dir is created by the first
// Put; until then reads find nothing and listings are empty.
func New(dir string) (*Driver, error) {
	d := &Driver{dir: dir}
	if err := d.ensure(false); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return nil, err
	}
	return d, nil
}

// ensure opens the root directory, creating it first when create is set.
// Without create, a missing directory is an iofs.ErrNotExist error.
func (d *Driver) ensure(create bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.root != nil {
		return nil
	}
	if create {
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return fmt.Errorf("create root directory: %w", err)
		}
	}
	r, err := os.OpenRoot(d.dir)
	if err != nil {
		return fmt.Errorf("open root directory: %w", err)
	}
	captureEscapeErr(r)
	d.root = r
	return nil
}

// errPathEscapes holds the (unexported) error os.Root reports when a name
// or a symbolic link would leave the root, so ErrorCode can classify it with
// errors.Is. It is captured once from a lexical escape, which performs no I/O.
var (
	escapeOnce     sync.Once
	errPathEscapes error
)

func captureEscapeErr(r *os.Root) {
	escapeOnce.Do(func() {
		_, err := r.Lstat("..")
		var pe *iofs.PathError
		if errors.As(err, &pe) {
			errPathEscapes = pe.Err
		}
	})
}

// conflictError reports a key that the file system cannot hold because a
// file and a directory would share a name (keys "a" and "a/b").
type conflictError struct {
	key string
	err error
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("key %q conflicts with an existing file or directory: %v", e.key, e.err)
}

func (e *conflictError) Unwrap() error { return e.err }

func native(key string) string { return filepath.FromSlash(key) }

// NewRangeReader implements backend.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	r, err := d.newRangeReader(ctx, key, offset, length)
	return r, d.explain(err)
}

func (d *Driver) newRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("negative offset %d: %w", offset, backend.ErrInvalidKey)
	}
	if err := d.ensure(false); err != nil {
		return nil, err
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer; fstat of the
	// opened file then tells what it is, with no window for a swap.
	f, err := d.root.OpenFile(native(key), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, notAnObject(key, fi.Mode())
	}
	size := fi.Size()
	if offset >= size || length == 0 {
		f.Close()
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	n := size - offset
	if length >= 0 && length < n {
		n = length
	}
	return newFileReader(ctx, d, f, offset, offset+n), nil
}

// Remain implements backend.Remainer.
func (r *fileReader) Remain() int64 { return r.end - r.off }

// ErrNotRegular is the error for a key that names something other than a
// regular file (a FIFO, a socket, a device): storage holds a thing that is
// not an object where an object is expected. It is never "not found", so a
// checkpoint whose metadata key is such a thing is reported, not taken for
// uncommitted. A directory at a key is a prefix, and so not found.
var ErrNotRegular = ckpterr.New(ckpterr.BadCheckpoint, "not a regular file")

// notAnObject is the error for a key whose file has mode m (not regular).
func notAnObject(key string, m iofs.FileMode) error {
	if m.IsDir() {
		return &iofs.PathError{Op: "open", Path: key, Err: iofs.ErrNotExist}
	}
	return fmt.Errorf("%s is a %s: %w", key, fileKind(m), ErrNotRegular)
}

// fileKind names the kind of a non-regular file mode.
func fileKind(m iofs.FileMode) string {
	switch {
	case m&iofs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&iofs.ModeSocket != 0:
		return "socket"
	case m&iofs.ModeCharDevice != 0:
		return "character device"
	case m&iofs.ModeDevice != 0:
		return "device"
	case m&iofs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "non-regular file (" + m.String() + ")"
}

// fileReader reads the bytes [off, end) of f.
type fileReader struct {
	ctx      context.Context
	d        *Driver
	f        *os.File
	off, end int64
	cached   cachedReader // the page-cache fast path, where the platform has one
}

func newFileReader(ctx context.Context, d *Driver, f *os.File, off, end int64) *fileReader {
	r := &fileReader{ctx: ctx, d: d, f: f, off: off, end: end}
	r.cached.init(f)
	return r
}

func (r *fileReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	if r.off >= r.end {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.end-r.off)]
	// What the page cache holds is copied without blocking; the rest (or
	// all of it, where there is no such path) is read as usual.
	n := r.cached.read(&r.d.noCached, p, r.off)
	if n < len(p) {
		k, err := r.f.ReadAt(p[n:], r.off+int64(n))
		n += k
		if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
			r.off += int64(n)
			return n, err
		}
	}
	r.off += int64(n)
	return n, nil
}

func (r *fileReader) Close() error { return r.f.Close() }

// goneErr marks a directory that could not be opened for listing; isGone
// tells whether it had disappeared (deleted while the walk was running).
type goneErr struct{ err error }

func (g goneErr) Error() string { return g.err.Error() }
func (g goneErr) Unwrap() error { return g.err }

func isGone(err error) bool {
	var g goneErr
	return errors.As(err, &g) && (errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR))
}

// copyBufs are Put's copy buffers: 1 MiB, so a large object is written in
// few system calls (io.Copy's default is 32 KiB).
var copyBufs = bufpool.New(1 << 20)

// writebackWindow is how many written bytes of an object's temporary file
// accumulate before fileWriter asks the kernel to start writing them to
// the disk. Without it the disk idles while the whole body is copied into
// the page cache and the fdatasync before publish then waits for all of
// it; with it the disk writes while later bytes are still being copied,
// and the fdatasync waits only for the last window (docs/PERFORMANCE.md).
const writebackWindow = 8 << 20

// fileWriter writes an object's body to its temporary file, failing with
// the context's error between writes once ctx ends, and starts the disk's
// writeback of every completed writebackWindow. It has no ReadFrom, so
// io.CopyBuffer uses its buffer.
type fileWriter struct {
	ctx     context.Context
	f       *os.File
	written int64 // bytes written so far
	started int64 // bytes whose writeback has been started
}

func (w *fileWriter) Write(p []byte) (int, error) {
	if err := w.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := w.f.Write(p)
	w.written += int64(n)
	if pending := w.written - w.started; pending >= writebackWindow {
		startWriteback(w.f, w.started, pending)
		w.started = w.written
	}
	return n, err
}

// Put implements backend.Driver: temp file, write, fdatasync, publish,
// fsync dir. A body that is an io.WriterTo (the Store's body of a
// backend.SlicesReader) writes its bytes to the file itself, with no copy
// buffer in between.
func (d *Driver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer func() { err = d.explain(err) }()
	if strings.HasPrefix(path.Base(key), TempPrefix) {
		return fmt.Errorf("key %q uses the reserved temporary-file prefix %q: %w", key, TempPrefix, backend.ErrInvalidKey)
	}
	if size < 0 {
		return fmt.Errorf("negative size %d: %w", size, backend.ErrSizeMismatch)
	}
	if err := d.ensure(true); err != nil {
		return err
	}
	dir := path.Dir(key)
	f, tmp, err := d.createTemp(dir)
	if err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			return &conflictError{key: key, err: err}
		}
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			// Best effort: the temp file is hidden from List anyway.
			_ = d.root.Remove(tmp)
		}
	}()

	// r is the Store's exact-size body: size bytes, then io.EOF, or an
	// error (the Store is the one place that enforces the declared size).
	fw := &fileWriter{ctx: ctx, f: f}
	if wt, ok := r.(io.WriterTo); ok {
		// The body writes its own bytes (the caller's slices, through the
		// Store's exact-size wrapper): each byte is copied once, by the
		// kernel, into the page cache.
		_, err = wt.WriteTo(fw)
	} else {
		buf, _ := copyBufs.Get(ctx, copyBufs.Size()) // unbounded: never blocks or fails
		_, err = io.CopyBuffer(fw, r, buf)
		copyBufs.Put(buf)
	}
	if err != nil {
		return fmt.Errorf("write %q: %w", key, err)
	}
	// The data (and the size, which reading it needs) must be durable
	// before the object is published; fdatasync skips the timestamps.
	if err := datasync(f); err != nil {
		return fmt.Errorf("fsync %q: %w", key, err)
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return fmt.Errorf("close %q: %w", key, cerr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	if opts.IfNotExists {
		if err := d.root.Link(tmp, native(key)); err != nil {
			return err
		}
		// The object is published; a leftover temp file is only litter.
		_ = d.root.Remove(tmp)
	} else if err := d.root.Rename(tmp, native(key)); err != nil {
		if fi, serr := d.root.Lstat(native(key)); serr == nil && fi.IsDir() {
			return &conflictError{key: key, err: err}
		}
		return err
	}
	// Make the new directory entry durable. The object is already visible,
	// so a failure here is reported but the object stays.
	return d.syncDir(dir)
}

// createTemp creates a fresh hidden file in dir, creating dir as needed. A
// concurrent Delete may remove a just-created empty parent, so creation is
// retried a few times.
func (d *Driver) createTemp(dir string) (*os.File, string, error) {
	var lastErr error
	for range 5 {
		if dir != "." {
			if err := d.root.MkdirAll(native(dir), 0o755); err != nil {
				return nil, "", fmt.Errorf("create directory %q: %w", dir, err)
			}
		}
		tmp := native(path.Join(dir, tempName()))
		f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			d.sweepDir(dir)
			return f, tmp, nil
		}
		lastErr = err
		if !errors.Is(err, iofs.ErrNotExist) && !errors.Is(err, iofs.ErrExist) {
			break
		}
	}
	return nil, "", lastErr
}

func (d *Driver) syncDir(dir string) error {
	df, err := d.root.Open(native(dir))
	if err != nil {
		return fmt.Errorf("open directory %q for fsync: %w", dir, err)
	}
	defer df.Close()
	if err := df.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		// EINVAL: the file system does not support fsync on directories.
		return fmt.Errorf("fsync directory %q: %w", dir, err)
	}
	return nil
}

// Stat implements backend.Driver. Directories are not objects.
func (d *Driver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	a, err := d.stat(ctx, key)
	return a, d.explain(err)
}

func (d *Driver) stat(ctx context.Context, key string) (backend.Attributes, error) {
	if err := ctx.Err(); err != nil {
		return backend.Attributes{}, err
	}
	if err := d.ensure(false); err != nil {
		return backend.Attributes{}, err
	}
	fi, err := d.root.Stat(native(key))
	if err != nil {
		return backend.Attributes{}, err
	}
	if !fi.Mode().IsRegular() {
		return backend.Attributes{}, notAnObject(key, fi.Mode())
	}
	return backend.Attributes{Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List implements backend.Driver. It walks the directories below prefix
// depth first, sorting each directory's entries by the key they lead to (a
// directory "d" sorts as "d/"), which yields the global byte order of keys
// while reading one directory at a time. Temporary files are skipped;
// symbolic links to regular files inside the root are listed, other links
// (to directories, or out of the root) are not followed.
func (d *Driver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.explain(d.list(ctx, prefix, fn))
}

func (d *Driver) list(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	if err := d.ensure(false); errors.Is(err, iofs.ErrNotExist) {
		return ctx.Err()
	} else if err != nil {
		return err
	}
	start := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i+1]
	}
	err := d.walk(ctx, start, prefix, fn)
	if start != "" && (errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
		return nil
	}
	return err
}

type entry struct {
	sortKey string // key, or key + "/" for a directory
	name    string
	dir     bool
}

// ListDelimited implements backend.Driver with one directory read: the
// regular files of the directory at prefix are its objects, and each
// subdirectory holding at least one object (found by walking it until the
// first one) is a common prefix.
func (d *Driver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.explain(d.listDelimited(ctx, prefix, fn))
}

func (d *Driver) listDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	if err := d.ensure(false); errors.Is(err, iofs.ErrNotExist) {
		return ctx.Err()
	} else if err != nil {
		return err
	}
	entries, err := d.readLevel(ctx, prefix, prefix)
	if isGone(err) && prefix != "" {
		return ctx.Err() // no such directory: an empty level
	}
	if err != nil {
		return err
	}
	errFound := errors.New("found an object")
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.dir {
			werr := d.walk(ctx, e.sortKey, e.sortKey, func(backend.ObjectInfo) error { return errFound })
			switch {
			case errors.Is(werr, errFound), errors.Is(werr, iofs.ErrPermission):
				// A subdirectory this process may not read is listed
				// too: it may hold objects, and the caller meets the
				// refusal, naming it, when it reads them.
				if err := fn(backend.ObjectInfo{Key: e.sortKey, IsPrefix: true}); err != nil {
					return err
				}
			case werr != nil && !isGone(werr):
				return werr
			}
			continue
		}
		o, ok, err := d.object(prefix + e.name)
		if err != nil {
			return err
		}
		if ok {
			if err := fn(o); err != nil {
				return err
			}
		}
	}
	return nil
}

// walk lists directory dir (a key prefix: "" or ending in "/").
func (d *Driver) walk(ctx context.Context, dir, prefix string, fn func(backend.ObjectInfo) error) error {
	entries, err := d.readLevel(ctx, dir, prefix)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.dir {
			err := d.walk(ctx, e.sortKey, prefix, fn)
			if err != nil && !isGone(err) {
				return err
			}
			continue // a directory removed meanwhile (a concurrent gc) lists as empty
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		o, ok, err := d.object(dir + e.name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// readLevel reads directory dir (a key prefix: "" or ending in "/") and
// returns its entries that lead to keys under prefix, temporary files
// left out, sorted by the key they lead to.
func (d *Driver) readLevel(ctx context.Context, dir, prefix string) ([]entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	name := "."
	if dir != "" {
		name = native(strings.TrimSuffix(dir, "/"))
	}
	df, err := d.root.Open(name)
	if err != nil {
		return nil, goneErr{err}
	}
	des, err := df.ReadDir(-1)
	df.Close()
	if err != nil {
		return nil, goneErr{fmt.Errorf("read directory %q: %w", name, err)}
	}
	entries := make([]entry, 0, len(des))
	for _, de := range des {
		n := de.Name()
		if strings.HasPrefix(n, TempPrefix) {
			continue
		}
		e := entry{name: n, dir: de.IsDir(), sortKey: dir + n}
		if e.dir {
			e.sortKey += "/"
		}
		if !strings.HasPrefix(e.sortKey, prefix) && !(e.dir && strings.HasPrefix(prefix, e.sortKey)) {
			continue
		}
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].sortKey < entries[j].sortKey })
	return entries, nil
}

// object stats key for a listing: ok is false for what is not listed (a
// file deleted meanwhile, a link out of the root or to a non-file).
func (d *Driver) object(key string) (backend.ObjectInfo, bool, error) {
	// Stat through the root: follows links that stay inside it and
	// refuses the others, which are skipped.
	fi, err := d.root.Stat(native(key))
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) || (errPathEscapes != nil && errors.Is(err, errPathEscapes)) || errors.Is(err, syscall.ELOOP) {
			return backend.ObjectInfo{}, false, nil
		}
		return backend.ObjectInfo{}, false, err
	}
	if !fi.Mode().IsRegular() {
		return backend.ObjectInfo{}, false, nil
	}
	return backend.ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, true, nil
}

// Delete implements backend.Driver. A missing key (or a directory) is not an
// error. Parent directories left empty are removed up to the root, best
// effort.
func (d *Driver) Delete(ctx context.Context, key string) error {
	return d.explain(d.delete(ctx, key))
}

func (d *Driver) delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.ensure(false); errors.Is(err, iofs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	fi, err := d.root.Lstat(native(key))
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil
		}
		return err
	}
	if fi.IsDir() {
		return nil
	}
	if err := d.root.Remove(native(key)); err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil
		}
		return err
	}
	d.pruneParents(key)
	return nil
}

// pruneParents removes the directories above key that are left empty, up
// to the root, best effort.
func (d *Driver) pruneParents(key string) {
	for dir := path.Dir(key); dir != "." && dir != "/"; dir = path.Dir(dir) {
		// Only real directories: removing a symbolic link to a directory
		// would unlink the link itself.
		fi, err := d.root.Lstat(native(dir))
		if err != nil || !fi.IsDir() {
			break
		}
		if d.root.Remove(native(dir)) != nil {
			break // not empty (or anything else): stop, best effort
		}
	}
}

// Capabilities implements backend.Driver.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{CreateIfAbsent: true}
}

// ErrorCode implements backend.Driver.
func (d *Driver) ErrorCode(err error) backend.Code {
	if err == nil {
		return backend.CodeUnknown
	}
	var ce *conflictError
	switch {
	case errors.As(err, &ce):
		return backend.CodeUnknown
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return backend.CodeCanceled
	case errPathEscapes != nil && errors.Is(err, errPathEscapes):
		return backend.CodePermission
	}
	if c := backend.CodeOf(err); c != backend.CodeUnknown {
		return c
	}
	switch {
	case errors.Is(err, iofs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return backend.CodeNotFound
	case errors.Is(err, iofs.ErrExist):
		return backend.CodeAlreadyExists
	case errors.Is(err, iofs.ErrPermission):
		return backend.CodePermission
	case d.refusalCode(err) != backend.CodeUnknown:
		return d.refusalCode(err)
	case errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN):
		return backend.CodeTransient
	}
	return backend.CodeUnknown
}

// Close releases the root directory handle.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.root == nil {
		return nil
	}
	return d.root.Close()
}

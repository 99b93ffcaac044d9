// Package mem is the ckptkit driver for in-memory storage, built on
// gocloud.dev/blob/memblob. URLs have the form mem://NAME/prefix: buckets
// are shared process-wide by NAME, so two Opens of mem://x see the same
// objects, while mem:// (no name) gets a fresh anonymous bucket per Open.
// The URL path becomes the Store's key prefix.
//
// Importing the package registers the "mem" scheme.
package mem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/backend"
	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"
	"gocloud.dev/gcerrors"
)

func init() {
	backend.MustRegister("mem", Open)
}

var (
	bucketsMu sync.Mutex
	buckets   = map[string]*blob.Bucket{}
)

// named returns the process-wide bucket called name, creating it.
func named(name string) *blob.Bucket {
	bucketsMu.Lock()
	defer bucketsMu.Unlock()
	b, ok := buckets[name]
	if !ok {
		b = memblob.OpenBucket(nil)
		buckets[name] = b
	}
	return b
}

// Reset drops the named bucket and its objects; the next Open of
// mem://name starts empty. Drivers already open on it keep working on the
// dropped bucket. Meant for tests.
func Reset(name string) {
	bucketsMu.Lock()
	defer bucketsMu.Unlock()
	delete(buckets, name)
}

// Open is the backend.Opener for mem:// URLs. The host names the shared
// bucket (empty: a fresh anonymous one); the path is returned as the prefix.
func Open(_ context.Context, u *url.URL) (backend.Driver, string, error) {
	if u.User != nil {
		return nil, "", fmt.Errorf("mem URL takes no credentials: %w", backend.ErrUnsupported)
	}
	prefix := strings.Trim(u.Path, "/")
	if u.Host == "" {
		return &Driver{bucket: memblob.OpenBucket(nil), owned: true}, prefix, nil
	}
	return &Driver{bucket: named(u.Host)}, prefix, nil
}

// New returns a driver on a fresh anonymous in-memory bucket.
func New() *Driver {
	return &Driver{bucket: memblob.OpenBucket(nil), owned: true}
}

// Driver is a backend.Driver on an in-memory gocloud.dev bucket.
type Driver struct {
	bucket *blob.Bucket
	owned  bool // anonymous bucket: closed with the driver
}

var _ backend.Driver = (*Driver)(nil)

// NewRangeReader implements backend.Driver. An offset at or past the end
// yields an empty reader.
func (d *Driver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := d.bucket.NewRangeReader(ctx, key, offset, length, nil)
	if err != nil {
		return nil, fmt.Errorf("open %q: %w", key, err)
	}
	return &ctxReader{ctx: ctx, r: r}, nil
}

type ctxReader struct {
	ctx context.Context
	r   *blob.Reader
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

func (r *ctxReader) Close() error { return r.r.Close() }

// Put implements backend.Driver. The object is committed by the writer's
// Close; on any failure the writer's context is cancelled first, which makes
// Close abort without publishing. Create-if-absent uses the bucket's native
// IfNotExist precondition, checked atomically at commit.
func (d *Driver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("negative size %d: %w", size, backend.ErrSizeMismatch)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ct := opts.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	w, err := d.bucket.NewWriter(wctx, key, &blob.WriterOptions{ContentType: ct, IfNotExist: opts.IfNotExists})
	if err != nil {
		return fmt.Errorf("create writer for %q: %w", key, err)
	}
	abort := func(cause error) error {
		cancel()
		_ = w.Close() // aborted: returns the cancellation, publishes nothing
		return cause
	}
	// r is the Store's exact-size body: size bytes, then io.EOF, or an
	// error (the Store is the one place that enforces the declared size).
	if _, err := io.Copy(w, ctxSource{ctx: ctx, r: r}); err != nil {
		return abort(fmt.Errorf("write %q: %w", key, err))
	}
	if err := ctx.Err(); err != nil {
		return abort(err)
	}
	if err := w.Close(); err != nil {
		if opts.IfNotExists && gcerrors.Code(err) == gcerrors.FailedPrecondition {
			return fmt.Errorf("create %q: %w: %w", key, backend.ErrAlreadyExists, err)
		}
		return fmt.Errorf("commit %q: %w", key, err)
	}
	return nil
}

// ctxSource fails with the context's error between reads once ctx ends.
type ctxSource struct {
	ctx context.Context
	r   io.Reader
}

func (s ctxSource) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	return s.r.Read(p)
}

// Stat implements backend.Driver. Memory buckets keep no CRC32C.
func (d *Driver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	if err := ctx.Err(); err != nil {
		return backend.Attributes{}, err
	}
	a, err := d.bucket.Attributes(ctx, key)
	if err != nil {
		return backend.Attributes{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return backend.Attributes{Size: a.Size, ModTime: a.ModTime}, nil
}

// List implements backend.Driver, streaming the bucket's sorted listing.
func (d *Driver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, &blob.ListOptions{Prefix: prefix}, fn)
}

// ListDelimited implements backend.Driver with the bucket's delimiter
// listing (common prefixes arrive as directory entries).
func (d *Driver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, &blob.ListOptions{Prefix: prefix, Delimiter: backend.Delimiter}, fn)
}

// list streams one bucket listing; directory entries only exist with a
// delimiter and become common prefixes.
func (d *Driver) list(ctx context.Context, opts *blob.ListOptions, fn func(backend.ObjectInfo) error) error {
	it := d.bucket.List(opts)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		o, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %q: %w", opts.Prefix, err)
		}
		e := backend.ObjectInfo{Key: o.Key, Size: o.Size, ModTime: o.ModTime}
		if o.IsDir {
			if opts.Delimiter == "" {
				continue
			}
			e = backend.ObjectInfo{Key: o.Key, IsPrefix: true}
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// Delete implements backend.Driver; a missing key is not an error.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.bucket.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	return nil
}

// Capabilities implements backend.Driver.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{CreateIfAbsent: true}
}

// ErrorCode implements backend.Driver through gcerrors.Code.
func (d *Driver) ErrorCode(err error) backend.Code {
	if err == nil {
		return backend.CodeUnknown
	}
	if c := backend.CodeOf(err); c != backend.CodeUnknown {
		return c
	}
	switch gcerrors.Code(err) {
	case gcerrors.NotFound:
		return backend.CodeNotFound
	case gcerrors.AlreadyExists, gcerrors.FailedPrecondition:
		return backend.CodeAlreadyExists
	case gcerrors.PermissionDenied:
		return backend.CodePermission
	case gcerrors.Unimplemented:
		return backend.CodeUnsupported
	case gcerrors.InvalidArgument:
		return backend.CodeInvalidKey
	case gcerrors.ResourceExhausted:
		return backend.CodeTransient
	case gcerrors.Canceled, gcerrors.DeadlineExceeded:
		return backend.CodeCanceled
	}
	return backend.CodeUnknown
}

// Close closes an anonymous bucket; shared named buckets stay available to
// later Opens (see Reset).
func (d *Driver) Close() error {
	if d.owned {
		return d.bucket.Close()
	}
	return nil
}

// Package gcs is the ckptkit driver for Google Cloud Storage, built on
// cloud.google.com/go/storage. Importing it registers the "gs" URL scheme:
//
//	gs://bucket/prefix?chunk_size=16MiB
//
// Query parameters:
//
//	chunk_size  resumable-upload chunk size (default 16MiB, rounded up to a
//	            multiple of 256KiB, at most 2GiB); objects larger than one
//	            chunk go through a resumable upload
//
// and the Store's own stall_timeout (backend.StallTimeoutOption), which
// backend.Open takes out before the driver sees the URL: every request is
// watched for stalls (backend/stall).
//
// Sizes follow the one unit rule of internal/bytesize: a plain number is
// bytes, KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000.
//
// Credentials are Application Default Credentials. When STORAGE_EMULATOR_HOST
// is set (for example to fake-gcs-server), the client talks to that host
// without authentication; the variable is read through backend.Getenv, so a
// caller may pass the environment of the moment (backend.WithEnv).
//
// Resumable uploads are tracked: GCS cannot list resumable sessions, so the
// driver records each one in a marker object (MarkerDir) while it is open,
// and lists and cancels what killed writers left (backend.UploadLister, used
// by ckpt gc). See sessions.go and docs/FORMAT.md.
//
// Known deviations of fake-gcs-server, the emulator the tests run against:
// it honours the DoesNotExist precondition on writes but ignores
// preconditions on reads and deletes, it does not check the CRC32C of
// resumable uploads, and it answers the cancellation of a resumable session
// (DELETE on its URI) with 499 but keeps the session usable (real GCS
// forgets it). The driver relies on none of these. It serves media downloads
// only to requests whose Host is its -public-host (scripts/test-servers.sh
// gives it one without a port, so they work through a proxy).
package gcs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"cloud.google.com/go/storage"
	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/stall"
	"github.com/ckptkit/ckptkit/internal/bytesize"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"
)

// Scheme is the URL scheme this package registers.
const Scheme = "gs"

// DefaultChunkSize is the default resumable-upload chunk size.
const DefaultChunkSize = 16 << 20

// chunkAlign is the granularity GCS requires of resumable chunks.
const chunkAlign = 256 << 10

// maxChunkSize bounds chunk_size: one chunk is buffered in memory per Put.
const maxChunkSize = 2 << 30

func init() {
	backend.MustRegister(Scheme, open)
}

// Options configure a Driver.
type Options struct {
	// ChunkSize is the resumable-upload chunk size (default
	// DefaultChunkSize, rounded up to a multiple of 256 KiB). Each Put
	// buffers up to one chunk; the client retries a failed chunk from it.
	ChunkSize int
	// ClientOptions are passed to storage.NewClient (credentials, endpoint).
	ClientOptions []option.ClientOption
}

// Driver is a backend.Driver on one GCS bucket.
type Driver struct {
	client *storage.Client
	// hc is the client's HTTP client: its transport records resumable
	// sessions (sessionTransport); AbortUpload cancels them with it.
	hc     *http.Client
	bucket *storage.BucketHandle
	name   string
	opts   Options
}

var (
	_ backend.Driver       = (*Driver)(nil)
	_ backend.UploadLister = (*Driver)(nil)
)

// credentialsFile is the client option of the Application Default
// Credentials file named by GOOGLE_APPLICATION_CREDENTIALS: the file's own
// "type", as the default credentials would take it (the user's file, named
// by their environment).
func credentialsFile(file string) (option.ClientOption, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("gcs: GOOGLE_APPLICATION_CREDENTIALS: %w", err)
	}
	var f struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("gcs: GOOGLE_APPLICATION_CREDENTIALS %s is not a JSON credentials file: %w", file, err)
	}
	return option.WithAuthCredentialsJSON(option.CredentialsType(f.Type), b), nil
}

// New returns a driver for bucket. It builds the client but does not contact
// the service.
func New(ctx context.Context, bucket string, opts Options) (*Driver, error) {
	if bucket == "" {
		return nil, errors.New("gcs: empty bucket name")
	}
	if opts.ChunkSize == 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if opts.ChunkSize < 0 {
		return nil, fmt.Errorf("gcs: negative chunk size %d", opts.ChunkSize)
	}
	opts.ChunkSize = roundChunk(opts.ChunkSize)
	copts := opts.ClientOptions
	if host := backend.Getenv(ctx, "STORAGE_EMULATOR_HOST"); host != "" {
		// The endpoint is given explicitly: storage.NewClient would read
		// the variable from the process environment, which may be stale
		// (backend.WithEnv).
		if !strings.Contains(host, "://") {
			host = "http://" + host
		}
		copts = append([]option.ClientOption{option.WithoutAuthentication(),
			option.WithEndpoint(strings.TrimSuffix(host, "/") + "/storage/v1/")}, copts...)
	} else if file := backend.Getenv(ctx, "GOOGLE_APPLICATION_CREDENTIALS"); file != "" {
		// Given explicitly for the same reason: the default credentials
		// would read the variable from the process environment.
		o, err := credentialsFile(file)
		if err != nil {
			return nil, err
		}
		copts = append([]option.ClientOption{o}, copts...)
	}
	// The HTTP client is built here (as storage.NewClient would, with its
	// scopes and credentials) so that its transport can see the responses
	// that open resumable sessions: their URI is recorded in a marker
	// before the first chunk (sessions.go).
	hc, _, err := htransport.NewClient(ctx, append([]option.ClientOption{
		option.WithScopes(storage.ScopeFullControl, "https://www.googleapis.com/auth/cloud-platform")}, copts...)...)
	if err != nil {
		return nil, fmt.Errorf("gcs: HTTP client: %w", err)
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hcCopy := *hc // a caller's client (option.WithHTTPClient) stays as it was
	// Under the session tracking, every request is watched for stalls
	// (backend/stall), the markers' and cancellations' too.
	hcCopy.Transport = &sessionTransport{base: stall.Wrap(base)}
	client, err := storage.NewClient(ctx, append(copts, option.WithHTTPClient(&hcCopy))...)
	if err != nil {
		return nil, fmt.Errorf("gcs: client: %w", err)
	}
	// The Store owns retries (backend.RetryPolicy): the client makes one
	// attempt per call, so its retries (until a deadline, by default) do not
	// stack under the Store's. A failed resumable chunk fails the Put, which
	// the Store retries from the start when the source rewinds. RetryNever
	// alone is not enough: it leaves the upload library's default chunk
	// retries (5xx retried for 32 s) in place; a retry predicate that says
	// no reaches those too.
	client.SetRetry(storage.WithPolicy(storage.RetryAlways), storage.WithMaxAttempts(1),
		storage.WithErrorFunc(func(error) bool { return false }))
	return &Driver{client: client, hc: &hcCopy, bucket: client.Bucket(bucket), name: bucket, opts: opts}, nil
}

func roundChunk(n int) int {
	return (n + chunkAlign - 1) / chunkAlign * chunkAlign
}

// open is the backend.Opener of the "gs" scheme.
func open(ctx context.Context, u *url.URL) (backend.Driver, string, error) {
	if u.User != nil {
		return nil, "", errors.New("gcs: credentials in the URL are not accepted; use Application Default Credentials")
	}
	var opts Options
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "chunk_size":
			n, err := bytesize.Parse(v)
			if err == nil && n > maxChunkSize {
				err = fmt.Errorf("size %q is above the %d-byte limit", v, maxChunkSize)
			}
			if err != nil {
				return nil, "", fmt.Errorf("gcs: URL parameter chunk_size: %w", err)
			}
			opts.ChunkSize = int(n)
		default:
			return nil, "", fmt.Errorf("gcs: unknown URL parameter %q", k)
		}
	}
	d, err := New(ctx, u.Host, opts)
	if err != nil {
		return nil, "", err
	}
	return d, strings.Trim(u.Path, "/"), nil
}

// Bucket returns the driver's bucket name.
func (d *Driver) Bucket() string { return d.name }

// ChunkSize returns the effective resumable-upload chunk size.
func (d *Driver) ChunkSize() int { return d.opts.ChunkSize }

// Client returns the underlying storage client, for operations the Driver
// interface does not cover (bucket management).
func (d *Driver) Client() *storage.Client { return d.client }

// Capabilities implements backend.Driver. Uploads larger than one chunk are
// resumable: chunks go one after the other, so Concurrency is 1.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		CreateIfAbsent: true,
		ServerCRC32C:   true,
		Multipart:      true,
		PartSize:       int64(d.opts.ChunkSize),
		Concurrency:    1,
	}
}

// Close closes the client.
func (d *Driver) Close() error { return d.client.Close() }

// NewRangeReader implements backend.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if length == 0 {
		if _, err := d.Stat(ctx, key); err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	r, err := d.bucket.Object(key).NewRangeReader(ctx, offset, length)
	if err != nil {
		var ge *googleapi.Error
		if errors.As(err, &ge) && ge.Code == http.StatusRequestedRangeNotSatisfiable {
			// The object exists and the range starts at or past its end.
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
		return nil, fmt.Errorf("gcs: read %s: %w", key, err)
	}
	return r, nil
}

// Stat implements backend.Driver. GCS keeps a CRC32C of every object.
func (d *Driver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	a, err := d.bucket.Object(key).Attrs(ctx)
	if err != nil {
		return backend.Attributes{}, fmt.Errorf("gcs: stat %s: %w", key, err)
	}
	crc := a.CRC32C
	return backend.Attributes{Size: a.Size, ModTime: a.Updated, CRC32C: &crc}, nil
}

// List implements backend.Driver; GCS lists in lexicographic byte order.
// Upload markers (keys with a MarkerDir segment) are not listed.
func (d *Driver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, &storage.Query{Prefix: prefix}, fn)
}

// ListDelimited implements backend.Driver with a Delimiter query: GCS
// returns each common prefix as an entry with only Prefix set. The
// MarkerDir level is not listed.
func (d *Driver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, &storage.Query{Prefix: prefix, Delimiter: backend.Delimiter}, fn)
}

func (d *Driver) list(ctx context.Context, q *storage.Query, fn func(backend.ObjectInfo) error) error {
	return d.objects(ctx, "list", q, []string{"Name", "Size", "Updated"}, func(a *storage.ObjectAttrs) error {
		o := backend.ObjectInfo{Key: a.Name, Size: a.Size, ModTime: a.Updated}
		if a.Name == "" && a.Prefix != "" {
			o = backend.ObjectInfo{Key: a.Prefix, IsPrefix: true}
		}
		if isReserved(o.Key) {
			return nil // upload markers (MarkerDir) are not objects
		}
		return fn(o)
	})
}

// objects calls fn for every entry of the listing q, fetching only attrs;
// op names the operation in errors.
func (d *Driver) objects(ctx context.Context, op string, q *storage.Query, attrs []string, fn func(*storage.ObjectAttrs) error) error {
	if err := q.SetAttrSelection(attrs); err != nil {
		return fmt.Errorf("gcs: %s %s: %w", op, q.Prefix, err)
	}
	it := d.bucket.Objects(ctx, q)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("gcs: %s %s: %w", op, q.Prefix, err)
		}
		if err := fn(a); err != nil {
			return err
		}
	}
}

// Delete implements backend.Driver; a missing key is not an error.
func (d *Driver) Delete(ctx context.Context, key string) error {
	err := d.bucket.Object(key).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("gcs: delete %s: %w", key, err)
	}
	return nil
}

// Put implements backend.Driver. Objects up to one chunk go in a single
// request, larger ones through a resumable upload; either way the object
// appears only when the writer is closed, and a failed source or cancelled
// ctx cancels the writer's context, which abandons the upload. With
// IfNotExists the write carries the DoesNotExist precondition (412 ->
// CodeAlreadyExists). A CRC32C given in opts is sent for the server to check;
// otherwise the client computes one while streaming. A resumable upload's
// session is recorded in a marker object (MarkerDir) from before its first
// chunk until it is finalized or, when the Put fails, cancelled; keys with
// a MarkerDir segment are refused (CodeInvalidKey).
func (d *Driver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if size < 0 {
		return fmt.Errorf("gcs: put %s: negative size %d", key, size)
	}
	if isReserved(key) {
		return fmt.Errorf("gcs: put %s: %w", key, errReservedKey)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// If the client opens a resumable session (objects larger than one
	// chunk), it is recorded in a marker until it is finalized or
	// cancelled; a single-request upload leaves tr unused.
	tr := &tracker{d: d, key: key, id: newUploadID()}
	wctx = context.WithValue(wctx, trackerKey{}, tr)
	obj := d.bucket.Object(key)
	if opts.IfNotExists {
		obj = obj.If(storage.Conditions{DoesNotExist: true})
	}
	w := obj.NewWriter(wctx)
	// No larger buffer than the object needs.
	w.ChunkSize = min(d.opts.ChunkSize, roundChunk(int(min(size, int64(d.opts.ChunkSize)))+1))
	w.ContentType = opts.ContentType
	if w.ContentType == "" {
		w.ContentType = "application/octet-stream"
	}
	if opts.CRC32C != nil {
		w.CRC32C = *opts.CRC32C
		w.SendCRC32C = true
	}
	// r is the Store's exact-size body: size bytes, then io.EOF, or an
	// error (the Store is the one place that enforces the declared size).
	_, err := io.Copy(w, r)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		cancel() // abandons the upload; nothing is published
		_ = w.Close()
		_ = tr.done(ctx, true) // best effort: gc aborts what is left
		return fmt.Errorf("gcs: put %s: %w", key, hideSession(err))
	}
	if err := w.Close(); err != nil {
		_ = tr.done(ctx, true)
		return fmt.Errorf("gcs: put %s: %w", key, hideSession(err))
	}
	// The object is published; a marker that cannot be deleted now is
	// left to gc (cancelling a finalized session is a no-op).
	_ = tr.done(ctx, false)
	return nil
}

// hideSession keeps a resumable session URI out of err's message: a
// request on a session that failed in transport (a reset, a stall) comes
// back as a *url.Error naming the URI, whose upload_id authorises uploads
// to the object. The URL is cut at its query; the chain is unchanged.
func hideSession(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if base, q, ok := strings.Cut(ue.URL, "?"); ok && strings.Contains(q, "upload_id") {
			ue.URL = base + "?upload_id=REDACTED"
		}
	}
	return err
}

// ErrorCode implements backend.Driver. It classifies by the storage
// package's sentinels, googleapi.Error codes, context and network errors.
func (d *Driver) ErrorCode(err error) backend.Code {
	if err == nil {
		return backend.CodeUnknown
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return backend.CodeCanceled
	}
	if errors.Is(err, storage.ErrObjectNotExist) || errors.Is(err, storage.ErrBucketNotExist) {
		return backend.CodeNotFound
	}
	if c := backend.CodeOf(err); c != backend.CodeUnknown && c != backend.CodeCanceled {
		return c
	}
	if errors.Is(err, errReservedKey) {
		return backend.CodeInvalidKey
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		if ge.Code == http.StatusUnauthorized {
			return backend.CodePermission
		}
		return backend.CodeForHTTPStatus(ge.Code)
	}
	var he *httpStatusError
	if errors.As(err, &he) {
		if he.code == http.StatusUnauthorized {
			return backend.CodePermission
		}
		return backend.CodeForHTTPStatus(he.code)
	}
	return backend.NetworkErrorCode(err)
}

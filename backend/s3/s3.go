// Package s3 is the ckptkit driver for S3-compatible object stores, built on
// minio-go. Importing it registers the "s3" URL scheme:
//
//	s3://bucket/prefix?endpoint=host:port&region=us-east-1&insecure=true&path_style=true
//
// Query parameters:
//
//	endpoint             host[:port] or http(s)://host[:port] of the service
//	                     (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else s3.amazonaws.com)
//	region               bucket region (default: AWS_REGION, AWS_DEFAULT_REGION, else auto)
//	insecure=true        plain HTTP (same as secure=false)
//	path_style=true      path-style bucket addressing (needed by most non-AWS servers)
//	part_size            multipart part size (default 16MiB, minimum 5MiB)
//	concurrency          parts in flight per upload (default 8)
//	multipart_threshold  objects larger than this use multipart uploads (default 64MiB)
//
// and the Store's own stall_timeout (backend.StallTimeoutOption), which
// backend.Open takes out before the driver sees the URL: every request is
// watched for stalls (backend/stall).
//
// Sizes follow the one unit rule of internal/bytesize: a plain number is
// bytes, KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000 (so
// part_size=16MB is 16000000 bytes, part_size=16MiB 16777216).
//
// Uploads send their bodies as UNSIGNED-PAYLOAD, also over plain HTTP: the
// body's CRC32C, a signed header (or an unsigned trailer when it is
// computed while streaming), is what the server verifies. The body itself
// is not hashed for the signature, so on an untrusted network use https.
//
// Credentials never come from the URL. They come, in this order, from
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials, profile
// AWS_PROFILE) and the EC2/ECS instance role. Opened by URL, the driver reads
// these variables (and the endpoint and region ones) through backend.Getenv,
// so a caller may pass the environment of the moment (backend.WithEnv).
package s3

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/stall"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bufpool"
	"github.com/ckptkit/ckptkit/internal/bytesize"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
	"golang.org/x/sync/errgroup"
)

// Scheme is the URL scheme this package registers.
const Scheme = "s3"

// Size limits of the S3 multipart protocol.
const (
	// MinPartSize is the smallest part S3 accepts (except for the last one).
	MinPartSize = 5 << 20
	// MaxPartSize is the largest part S3 accepts.
	MaxPartSize = 5 << 30
	// MaxParts is the largest number of parts of one upload.
	MaxParts = 10000
)

// Defaults of Options.
const (
	DefaultPartSize           = 16 << 20
	DefaultConcurrency        = 8
	DefaultMultipartThreshold = 64 << 20
)

// abortTimeout bounds the clean-up of a failed multipart upload, which runs
// on a fresh context because the caller's may already be cancelled, and
// the start of one.
const abortTimeout = 30 * time.Second

// completeTimeout bounds the completion of a multipart upload, retries
// included. S3 may take minutes to complete a large upload (it keeps the
// connection alive meanwhile, so the stall deadline does not cut it); a
// server that stopped answering is caught by the stall deadline long
// before.
const completeTimeout = 15 * time.Minute

func init() {
	backend.MustRegister(Scheme, open)
}

// Options configure a Driver.
type Options struct {
	// Endpoint is host[:port] of the S3 service (default s3.amazonaws.com).
	Endpoint string
	// Region of the bucket; empty lets the client discover it.
	Region string
	// Insecure selects plain HTTP.
	Insecure bool
	// PathStyle selects path-style bucket addressing.
	PathStyle bool
	// PartSize is the multipart part size (default DefaultPartSize, at least
	// MinPartSize). It grows automatically when an object would need more
	// than MaxParts parts.
	PartSize int64
	// Concurrency is the number of parts uploaded at once per Put (default
	// DefaultConcurrency). Memory use per Put is about (Concurrency+1)*PartSize.
	Concurrency int
	// MultipartThreshold: objects larger than this are uploaded in parts
	// (default DefaultMultipartThreshold).
	MultipartThreshold int64
	// Credentials overrides the default chain (environment, shared file,
	// instance role).
	Credentials *credentials.Credentials
}

func (o *Options) setDefaults() error {
	if o.Endpoint == "" {
		o.Endpoint = "s3.amazonaws.com"
	}
	if o.PartSize == 0 {
		o.PartSize = DefaultPartSize
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MultipartThreshold == 0 {
		o.MultipartThreshold = DefaultMultipartThreshold
	}
	switch {
	case o.PartSize < MinPartSize || o.PartSize > MaxPartSize:
		return fmt.Errorf("part size %d outside [%d, %d]", o.PartSize, MinPartSize, MaxPartSize)
	case o.Concurrency < 1:
		return fmt.Errorf("concurrency %d is below 1", o.Concurrency)
	case o.MultipartThreshold < 0 || o.MultipartThreshold > MaxPartSize:
		return fmt.Errorf("multipart threshold %d outside [0, %d]", o.MultipartThreshold, MaxPartSize)
	}
	return nil
}

// DefaultCredentials is the credential chain used when Options.Credentials
// is nil: environment, shared credentials file, instance role.
func DefaultCredentials() *credentials.Credentials {
	return credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{Client: &http.Client{Transport: http.DefaultTransport, Timeout: 5 * time.Second}},
	})
}

// envCredentials is DefaultCredentials with every variable read through
// getenv (the caller's environment of the moment, backend.EnvOf) instead of
// minio's os.Getenv: the keys (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN, or AWS_ACCESS_KEY / AWS_SECRET_KEY); the profile
// (AWS_PROFILE, else "default") of the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, else $HOME/.aws/credentials), then of the
// config file (AWS_CONFIG_FILE, else $HOME/.aws/config: static keys,
// credential_process, SSO), each named explicitly so that minio's own
// lookup of the process environment never runs; and the instance role or
// container credentials with their variables and region.
func envCredentials(getenv func(string) string) *credentials.Credentials {
	var chain []credentials.Provider
	id, secret := firstNonEmpty(getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_ACCESS_KEY")), firstNonEmpty(getenv("AWS_SECRET_ACCESS_KEY"), getenv("AWS_SECRET_KEY"))
	if id != "" && secret != "" {
		chain = append(chain, &credentials.Static{Value: credentials.Value{AccessKeyID: id, SecretAccessKey: secret,
			SessionToken: getenv("AWS_SESSION_TOKEN"), SignerType: credentials.SignatureV4}})
	}
	profile := firstNonEmpty(getenv("AWS_PROFILE"), "default")
	home := getenv("HOME")
	for _, f := range []struct{ env, name string }{{"AWS_SHARED_CREDENTIALS_FILE", "credentials"}, {"AWS_CONFIG_FILE", "config"}} {
		file := getenv(f.env)
		if file == "" && home != "" {
			file = filepath.Join(home, ".aws", f.name)
		}
		if file != "" {
			chain = append(chain, &credentials.FileAWSCredentials{Filename: file, Profile: profile})
		}
	}
	iam := &credentials.IAM{Client: &http.Client{Transport: http.DefaultTransport, Timeout: 5 * time.Second},
		Region: firstNonEmpty(getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION"))}
	iam.Container.AuthorizationToken = getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN")
	iam.Container.AuthorizationTokenFile = getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
	iam.Container.CredentialsRelativeURI = getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
	iam.Container.CredentialsFullURI = getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI")
	iam.EKSIdentity.TokenFile = getenv("AWS_WEB_IDENTITY_TOKEN_FILE")
	iam.EKSIdentity.RoleARN = getenv("AWS_ROLE_ARN")
	iam.EKSIdentity.RoleSessionName = getenv("AWS_ROLE_SESSION_NAME")
	return credentials.NewChainCredentials(append(chain, iam))
}

// Driver is a backend.Driver on one S3 bucket.
type Driver struct {
	bucket    string
	opts      Options
	client    *minio.Client
	core      minio.Core
	transport *http.Transport
	// sweeps are background re-aborts of failed multipart uploads; Close
	// waits for them.
	sweeps sync.WaitGroup
}

var _ backend.Driver = (*Driver)(nil)

// New returns a driver for bucket. It does not contact the service.
func New(bucket string, opts Options) (*Driver, error) {
	if bucket == "" {
		return nil, errors.New("s3: empty bucket name")
	}
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("s3: %w", err)
	}
	creds := opts.Credentials
	if creds == nil {
		creds = DefaultCredentials()
	}
	tr, err := minio.DefaultTransport(!opts.Insecure)
	if err != nil {
		return nil, fmt.Errorf("s3: transport: %w", err)
	}
	// Parts in flight each hold a connection; keep them for reuse.
	tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, opts.Concurrency*2)
	lookup := minio.BucketLookupAuto
	if opts.PathStyle {
		lookup = minio.BucketLookupPath
	}
	client, err := minio.New(opts.Endpoint, &minio.Options{
		Creds:           creds,
		Secure:          !opts.Insecure,
		Region:          opts.Region,
		BucketLookup:    lookup,
		Transport:       schemeHint{stall.Wrap(tr)},
		TrailingHeaders: true,
		// The Store owns retries (backend.RetryPolicy): one client-side
		// attempt keeps the two layers from multiplying each other's.
		MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("s3: client for endpoint %s: %w", opts.Endpoint, err)
	}
	return &Driver{bucket: bucket, opts: opts, client: client, core: minio.Core{Client: client}, transport: tr}, nil
}

// schemeHint makes an HTTPS request answered in plain HTTP (an endpoint
// such as a local test server without insecure=true) a usage error that
// says what to add, rather than an unclassified failure.
type schemeHint struct{ http.RoundTripper }

// RoundTrip sends req, classifying a scheme mismatch.
func (s schemeHint) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.RoundTripper.RoundTrip(req)
	// What http.Client turns into http.ErrSchemeMismatch, seen here first.
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && string(rh.RecordHeader[:]) == "HTTP/" {
		err = ckpterr.WithClass(fmt.Errorf("%w: %w (the endpoint %s speaks plain HTTP: add insecure=true to the URL)", http.ErrSchemeMismatch, err, req.URL.Host), ckpterr.Usage)
	}
	return resp, err
}

// open is the backend.Opener of the "s3" scheme. Every environment variable
// it uses is read through backend.Getenv (the caller's environment of the
// moment when ctx carries one).
func open(ctx context.Context, u *url.URL) (backend.Driver, string, error) {
	if u.User != nil {
		return nil, "", errors.New("s3: credentials in the URL are not accepted; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the shared credentials file")
	}
	getenv := backend.EnvOf(ctx)
	opts, err := parseQuery(u.Query(), getenv)
	if err != nil {
		return nil, "", err
	}
	opts.Credentials = envCredentials(getenv)
	// minio checks bucket names only when a request is made, with an
	// unclassified error; a name S3 forbids is the URL's fault.
	if err := s3utils.CheckValidBucketName(u.Host); err != nil {
		return nil, "", fmt.Errorf("s3: bucket %q: %w", u.Host, err)
	}
	d, err := New(u.Host, opts)
	if err != nil {
		return nil, "", err
	}
	return d, strings.Trim(u.Path, "/"), nil
}

// ParseQuery turns an s3:// URL's query into Options, filling what the query
// leaves out from the environment. Unknown parameters are an error.
func ParseQuery(q url.Values) (Options, error) { return parseQuery(q, os.Getenv) }

// parseQuery is ParseQuery reading the environment through getenv.
func parseQuery(q url.Values, getenv func(string) string) (Options, error) {
	var o Options
	endpoint := firstNonEmpty(q.Get("endpoint"), getenv("AWS_ENDPOINT_URL_S3"), getenv("AWS_ENDPOINT_URL"))
	if strings.Contains(endpoint, "://") {
		eu, err := url.Parse(endpoint)
		if err != nil || eu.Host == "" {
			return o, fmt.Errorf("s3: endpoint %q is not host[:port] or a URL", endpoint)
		}
		o.Insecure = eu.Scheme == "http"
		endpoint = eu.Host
	}
	o.Endpoint = endpoint
	o.Region = firstNonEmpty(q.Get("region"), getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION"))
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "endpoint", "region":
		case "insecure":
			var b bool
			b, err = strconv.ParseBool(v)
			o.Insecure = b
		case "secure":
			var b bool
			b, err = strconv.ParseBool(v)
			o.Insecure = !b
		case "path_style":
			o.PathStyle, err = strconv.ParseBool(v)
		case "part_size":
			o.PartSize, err = bytesize.Parse(v)
		case "multipart_threshold":
			o.MultipartThreshold, err = bytesize.Parse(v)
		case "concurrency":
			o.Concurrency, err = strconv.Atoi(v)
		default:
			return o, fmt.Errorf("s3: unknown URL parameter %q", k)
		}
		if err != nil {
			return o, fmt.Errorf("s3: URL parameter %s: %w", k, err)
		}
	}
	return o, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// Bucket returns the driver's bucket.
func (d *Driver) Bucket() string { return d.bucket }

// Options returns the driver's effective options (credentials omitted).
func (d *Driver) Options() Options {
	o := d.opts
	o.Credentials = nil
	return o
}

// Capabilities implements backend.Driver.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		CreateIfAbsent: true,
		ServerCRC32C:   true,
		Multipart:      true,
		PartSize:       d.opts.PartSize,
		Concurrency:    d.opts.Concurrency,
		// A single PUT streams its body; multipart uploads copy parts.
		StreamedPutBytes: d.opts.MultipartThreshold,
	}
}

// Close releases idle connections.
func (d *Driver) Close() error {
	d.WaitAborts()
	d.transport.CloseIdleConnections()
	return nil
}

// NewRangeReader implements backend.Driver with one ranged GET.
func (d *Driver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if length == 0 {
		// Nothing to read, but a missing key must still say so.
		if _, err := d.Stat(ctx, key); err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	var opts minio.GetObjectOptions
	switch {
	case length > 0:
		if err := opts.SetRange(offset, offset+length-1); err != nil {
			return nil, fmt.Errorf("s3: range: %w", err)
		}
	case offset > 0:
		if err := opts.SetRange(offset, 0); err != nil {
			return nil, fmt.Errorf("s3: range: %w", err)
		}
	}
	rc, info, _, err := d.core.GetObject(ctx, d.bucket, key, opts)
	if err != nil {
		var er minio.ErrorResponse
		if errors.As(err, &er) && (er.Code == minio.InvalidRange || er.StatusCode == http.StatusRequestedRangeNotSatisfiable) {
			// The object exists and the range starts at or past its end.
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
		return nil, fmt.Errorf("s3: get %s: %w", key, err)
	}
	return &sizedReader{ReadCloser: rc, left: info.Size}, nil
}

// sizedReader knows the length of the response body it reads (its
// Content-Length), for backend.Remainer.
type sizedReader struct {
	io.ReadCloser
	left int64
}

func (r *sizedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.left -= int64(n)
	return n, err
}

// Remain implements backend.Remainer.
func (r *sizedReader) Remain() int64 {
	if r.left < 0 {
		return -1
	}
	return r.left
}

// Stat implements backend.Driver.
func (d *Driver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	info, err := d.client.StatObject(ctx, d.bucket, key, minio.StatObjectOptions{Checksum: true})
	if err != nil {
		return backend.Attributes{}, fmt.Errorf("s3: stat %s: %w", key, err)
	}
	a := backend.Attributes{Size: info.Size, ModTime: info.LastModified}
	if !strings.EqualFold(info.ChecksumMode, "COMPOSITE") {
		a.CRC32C = decodeCRC32C(info.ChecksumCRC32C)
	}
	return a, nil
}

// decodeCRC32C decodes a whole-object x-amz-checksum-crc32c value. A
// composite multipart checksum ("...-N") is not a CRC of the object's bytes
// and yields nil.
func decodeCRC32C(s string) *uint32 {
	if s == "" || strings.Contains(s, "-") {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 4 {
		return nil
	}
	v := binary.BigEndian.Uint32(b)
	return &v
}

func encodeCRC32C(v uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return base64.StdEncoding.EncodeToString(b[:])
}

// List implements backend.Driver. S3 lists keys in ascending UTF-8 byte
// order, which is the order the Driver contract asks for.
func (d *Driver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, prefix, true, fn)
}

// list runs one ListObjectsV2 listing; without recursive, S3 groups keys
// by "/" and minio reports each common prefix as an entry whose key ends
// in "/" (no object key does: the Store refuses empty segments).
func (d *Driver) list(ctx context.Context, prefix string, recursive bool, fn func(backend.ObjectInfo) error) error {
	lctx, cancel := context.WithCancel(ctx)
	ch := d.client.ListObjects(lctx, d.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: recursive})
	defer func() {
		cancel()
		// Drain so the lister goroutine ends.
		for range ch {
		}
	}()
	for obj := range ch {
		if obj.Err != nil {
			return fmt.Errorf("s3: list %s: %w", prefix, obj.Err)
		}
		o := backend.ObjectInfo{Key: obj.Key, Size: obj.Size, ModTime: obj.LastModified}
		if !recursive && strings.HasSuffix(obj.Key, backend.Delimiter) {
			o = backend.ObjectInfo{Key: obj.Key, IsPrefix: true}
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// ListDelimited implements backend.Driver with a delimiter ("/") listing:
// S3 returns the common prefixes in place of the objects below them.
func (d *Driver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, prefix, false, fn)
}

// Delete implements backend.Driver; S3 deletes of missing keys succeed.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := d.client.RemoveObject(ctx, d.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("s3: delete %s: %w", key, err)
	}
	return nil
}

// Put implements backend.Driver: one PUT up to MultipartThreshold, a
// multipart upload above it. Both are conditional (If-None-Match: *) when
// opts.IfNotExists is set, and both carry CRC32C checksums the server checks.
func (d *Driver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if size < 0 {
		return fmt.Errorf("s3: put %s: negative size %d", key, size)
	}
	if size > d.opts.MultipartThreshold {
		return d.putMultipart(ctx, key, size, r, opts)
	}
	return d.putSingle(ctx, key, size, r, opts)
}

// putOptions are the minio options of a PUT. The payload is never hashed
// for the signature (DisableContentSha256: "UNSIGNED-PAYLOAD" over HTTPS,
// and over plain HTTP too, where minio would otherwise sign every 64 KiB
// chunk, allocating about 90 MB of garbage per GiB uploaded): the body's
// integrity is its CRC32C, sent as a signed header or a trailer and
// checked by the server.
func (d *Driver) putOptions(opts backend.PutOptions) minio.PutObjectOptions {
	po := minio.PutObjectOptions{ContentType: opts.ContentType, SendContentMd5: false, DisableContentSha256: true}
	if opts.IfNotExists {
		po.SetMatchETagExcept("*") // If-None-Match: *
	}
	return po
}

func (d *Driver) putSingle(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	po := d.putOptions(opts)
	if opts.CRC32C != nil {
		// Known up front: sent as a header, checked by the server.
		po.UserMetadata = map[string]string{"X-Amz-Checksum-Crc32c": encodeCRC32C(*opts.CRC32C)}
	} else {
		// Computed while streaming and sent as a trailer.
		po.Checksum = minio.ChecksumCRC32C
	}
	// r is the Store's exact-size body (size bytes, then io.EOF, or an
	// error): a failing source makes the request fail before the server
	// commits anything, and the Store reports the source's error. It is
	// streamed to the connection as it is read, never buffered whole, so
	// a Put up to MultipartThreshold holds no copy of the body
	// (Capabilities.StreamedPutBytes).
	if _, err := d.core.PutObject(ctx, d.bucket, key, r, size, "", "", po); err != nil {
		return fmt.Errorf("s3: put %s: %w", key, err)
	}
	return nil
}

// partSizeFor returns the part size for an object of size bytes: the
// configured one, grown (in MiB steps) when MaxParts parts would not hold it.
func (d *Driver) partSizeFor(size int64) int64 {
	ps := d.opts.PartSize
	if need := (size + MaxParts - 1) / MaxParts; need > ps {
		ps = (need + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return ps
}

// putMultipart uploads size bytes of r in parts: parts are read from r one
// after the other into pooled buffers and up to Concurrency of them are in
// flight. The object appears only on CompleteMultipartUpload, which carries
// If-None-Match: * for create-if-absent (minio-go's own PutObject drops that
// header on the completing request, so a large create-if-absent would
// silently overwrite). Each part carries its CRC32C and the completion the
// CRC32C of the whole body (a FULL_OBJECT checksum, computed while reading),
// which the server checks against the parts and keeps for Stat. Any failure
// aborts the upload.
func (d *Driver) putMultipart(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) (err error) {
	if opts.IfNotExists {
		// Cheap early exit; the conditional Complete below is what decides.
		if _, serr := d.Stat(ctx, key); serr == nil {
			return fmt.Errorf("s3: put %s: %w", key, backend.ErrAlreadyExists)
		} else if d.ErrorCode(serr) != backend.CodeNotFound {
			return serr
		}
	}
	partSize := d.partSizeFor(size)
	nparts := int((size + partSize - 1) / partSize)

	initOpts := minio.PutObjectOptions{
		ContentType:  opts.ContentType,
		UserMetadata: map[string]string{"X-Amz-Checksum-Algorithm": "CRC32C", "X-Amz-Checksum-Type": "FULL_OBJECT"},
	}
	// The upload is started on a context the caller cannot cancel midway
	// (bounded by abortTimeout): cancelled after the server created the
	// upload but before its reply arrived, the request would leave an
	// upload whose ID nobody knows, so nobody would abort it.
	ictx, icancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	uploadID, err := d.core.NewMultipartUpload(ictx, d.bucket, key, initOpts)
	icancel()
	if err != nil {
		return fmt.Errorf("s3: put %s: start multipart upload: %w", key, err)
	}
	defer func() {
		if err != nil {
			if aerr := d.abortUpload(context.WithoutCancel(ctx), key, uploadID); aerr != nil {
				err = fmt.Errorf("%w (abort of upload also failed: %v)", err, aerr)
			}
		}
	}()
	if err = ctx.Err(); err != nil {
		return fmt.Errorf("s3: put %s: %w", key, err)
	}

	parts := make([]minio.CompletePart, nparts)
	g, gctx := errgroup.WithContext(ctx)
	pool := bufpool.NewBounded(int(partSize), d.opts.Concurrency+1)
	full := crc32c.New()
	var readErr error
	for i := 0; i < nparts; i++ {
		n := min(partSize, size-int64(i)*partSize)
		buf, perr := pool.Get(gctx, int(n))
		if perr != nil {
			break // a part failed or ctx ended; g.Wait reports it
		}
		if rerr := readPart(r, buf); rerr != nil {
			pool.Put(buf)
			readErr = fmt.Errorf("read part %d: %w", i+1, rerr)
			break
		}
		full.Write(buf)
		partNum := i + 1
		g.Go(func() error {
			sum := crc32c.Checksum(buf)
			hdr := http.Header{}
			hdr.Set("X-Amz-Checksum-Crc32c", encodeCRC32C(sum))
			p, perr := d.putPart(gctx, key, uploadID, partNum, buf, hdr)
			if perr != nil {
				// The HTTP transport may still hold buf after a failed
				// request, so it is not reused; the cancelled group ends
				// the upload anyway.
				pool.Forget()
				return fmt.Errorf("upload part %d: %w", partNum, perr)
			}
			pool.Put(buf)
			parts[partNum-1] = minio.CompletePart{PartNumber: partNum, ETag: p.ETag, ChecksumCRC32C: firstNonEmpty(p.ChecksumCRC32C, encodeCRC32C(sum))}
			return nil
		})
	}
	gerr := g.Wait()
	switch {
	case readErr != nil:
		return fmt.Errorf("s3: put %s: %w", key, readErr)
	case gerr != nil:
		return fmt.Errorf("s3: put %s: %w", key, gerr)
	case ctx.Err() != nil:
		return fmt.Errorf("s3: put %s: %w", key, ctx.Err())
	}
	if opts.CRC32C != nil && full.Sum32() != *opts.CRC32C {
		return fmt.Errorf("s3: put %s: body CRC32C %08x does not match the declared %08x", key, full.Sum32(), *opts.CRC32C)
	}
	if err := d.complete(ctx, key, uploadID, parts, size, full.Sum32(), opts); err != nil {
		return fmt.Errorf("s3: put %s: complete multipart upload: %w", key, err)
	}
	return nil
}

// complete sends the CompleteMultipartUpload of an upload of size bytes
// whose CRC32C is crc: the commit. It is retried on transient failures
// with RetryWithin, under the Store's policy (the parts are stored, so a
// retry costs one small request). A request is never cut by the caller's
// cancellation midway (the server may complete a request the client
// gave up on), only between attempts; a stalled one fails as stalled
// (backend/stall), and the phase is bounded by completeTimeout.
//
// After an attempt whose outcome is unknown (its connection dropped, its
// answer lost, a 5xx), the next one may find the upload completed: the
// server answers NoSuchUpload, or, for create-if-absent, 412 because the
// object now exists. The commit is then ours when the object holds our
// bytes (committed): see there for why that check is sound.
func (d *Driver) complete(ctx context.Context, key, uploadID string, parts []minio.CompletePart, size int64, crc uint32, opts backend.PutOptions) error {
	copts := d.putOptions(opts)
	copts.UserMetadata = map[string]string{"X-Amz-Checksum-Crc32c": encodeCRC32C(crc), "X-Amz-Checksum-Type": "FULL_OBJECT"}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
	defer cancel()
	unknown := false // a previous attempt may have completed the upload
	return backend.RetryWithin(ctx, d.ErrorCode, func() error {
		_, err := d.core.CompleteMultipartUpload(cctx, d.bucket, key, uploadID, parts, copts)
		if err != nil && unknown {
			if d.committed(cctx, key, size, crc) {
				// An upload a failed attempt did not complete (a 412 from
				// another writer's identical object) is not left behind.
				if aerr := d.core.AbortMultipartUpload(cctx, d.bucket, key, uploadID); aerr != nil && minio.ToErrorResponse(aerr).Code != minio.NoSuchUpload {
					return fmt.Errorf("the object is committed, but the abort of upload %s failed: %w", uploadID, aerr)
				}
				return nil
			}
		}
		unknown = err != nil
		return err
	})
}

// committed reports whether key holds the object an upload of size bytes
// with CRC32C crc completes into. The server stores the FULL_OBJECT
// CRC32C the completion carried (it checked it against the parts and
// reports it to a HEAD with checksum mode), so an object of the same size
// and CRC32C holds our bytes unless another writer stored different bytes
// of the same length at the key with a colliding CRC: a 2^-32 chance, and
// only under a concurrent writer of the same key, whose commit would have
// been a conflict anyway. Another writer's identical bytes are the same
// object. An ETag cannot serve: servers compute multipart ETags
// differently (versitygw gives a plain MD5, AWS an MD5 of MD5s with the
// part count, an encrypted object a random one). A server that keeps no
// whole-object CRC32C gets nothing recognised: the failure stands.
func (d *Driver) committed(ctx context.Context, key string, size int64, crc uint32) bool {
	info, err := d.client.StatObject(ctx, d.bucket, key, minio.StatObjectOptions{Checksum: true})
	if err != nil || info.Size != size || strings.EqualFold(info.ChecksumMode, "COMPOSITE") {
		return false
	}
	got := decodeCRC32C(info.ChecksumCRC32C)
	return got != nil && *got == crc
}

// WaitAborts waits for the background re-aborts of failed multipart
// uploads (at most a few seconds). Close calls it.
func (d *Driver) WaitAborts() { d.sweeps.Wait() }

// abortUpload aborts a multipart upload. A part request the client
// cancelled may still be running on the server and recreate the upload
// after the abort (S3 documents that an abort may have to be repeated), so
// a bounded background sweep aborts it again a few times; Close waits for
// it. The failed Put itself returns right after the first abort.
func (d *Driver) abortUpload(ctx context.Context, key, uploadID string) error {
	actx, cancel := context.WithTimeout(ctx, abortTimeout)
	err := d.core.AbortMultipartUpload(actx, d.bucket, key, uploadID)
	cancel()
	if err != nil && minio.ToErrorResponse(err).Code == "NoSuchUpload" {
		err = nil
	}
	// Sweep even when the first abort failed (a 500 while a cancelled part
	// is still being written was seen on versitygw): the sweep retries it.
	d.sweeps.Add(1)
	go func() {
		defer d.sweeps.Done()
		sctx, cancel := context.WithTimeout(ctx, abortTimeout)
		defer cancel()
		for _, delay := range []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, time.Second} {
			select {
			case <-sctx.Done():
				return
			case <-time.After(delay):
			}
			_ = d.core.AbortMultipartUpload(sctx, d.bucket, key, uploadID)
		}
	}()
	return err
}

// readPart fills buf from r. Unlike io.ReadFull it keeps an error that
// arrives with the bytes completing buf: the Store's exact-size body reports
// an over-long source that way, with the last declared bytes.
func readPart(r io.Reader, buf []byte) error {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			if n < len(buf) {
				return fmt.Errorf("source ended %d bytes early: %w", len(buf)-n, io.ErrUnexpectedEOF)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// putPart uploads one buffered part. The part is in memory, so a transient
// failure retries the part, not the object: RetryWithin draws those
// retries from the Store's budget for this Put, so part and Put retries
// never multiply.
func (d *Driver) putPart(ctx context.Context, key, uploadID string, partNum int, buf []byte, hdr http.Header) (minio.ObjectPart, error) {
	var p minio.ObjectPart
	err := backend.RetryWithin(ctx, d.ErrorCode, func() error {
		var err error
		p, err = d.core.PutObjectPart(ctx, d.bucket, key, uploadID, partNum, bytes.NewReader(buf), int64(len(buf)),
			minio.PutObjectPartOptions{CustomHeader: hdr, DisableContentSha256: true}) // the part's CRC32C header is its check
		return err
	})
	return p, err
}

// ErrorCode implements backend.Driver. It classifies by S3 error code and
// HTTP status, by context errors and by network error types.
func (d *Driver) ErrorCode(err error) backend.Code {
	if err == nil {
		return backend.CodeUnknown
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return backend.CodeCanceled
	}
	if c := backend.CodeOf(err); c != backend.CodeUnknown && c != backend.CodeCanceled {
		return c
	}
	var er minio.ErrorResponse
	if errors.As(err, &er) {
		switch er.Code {
		case minio.NoSuchKey, minio.NoSuchBucket:
			return backend.CodeNotFound
		case minio.PreconditionFailed:
			return backend.CodeAlreadyExists
		case minio.AccessDenied, minio.InvalidAccessKeyID, minio.SignatureDoesNotMatch, "ExpiredToken", "InvalidToken":
			return backend.CodePermission
		case "SlowDown", "RequestTimeout", minio.InternalError, "ServiceUnavailable":
			return backend.CodeTransient
		case minio.InvalidBucketName, minio.XMinioInvalidObjectName:
			return backend.CodeInvalidKey
		case minio.NotImplemented:
			return backend.CodeUnsupported
		}
		return backend.CodeForHTTPStatus(er.StatusCode)
	}
	return backend.NetworkErrorCode(err)
}

// Client returns the underlying minio-go client, for operations the Driver
// interface does not cover (bucket management, inspecting incomplete
// multipart uploads).
func (d *Driver) Client() *minio.Client { return d.client }

// ListUploads implements backend.UploadLister: the bucket's incomplete
// multipart uploads of keys under prefix.
func (d *Driver) ListUploads(ctx context.Context, prefix string, fn func(backend.Upload) error) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops minio's listing goroutine when fn ends early
	for u := range d.client.ListIncompleteUploads(lctx, d.bucket, prefix, true) {
		if u.Err != nil {
			return fmt.Errorf("s3: list uploads %s: %w", prefix, u.Err)
		}
		if err := fn(backend.Upload{Key: u.Key, ID: u.UploadID, Initiated: u.Initiated, Size: u.Size}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// AbortUpload implements backend.UploadLister.
func (d *Driver) AbortUpload(ctx context.Context, key, id string) error {
	err := d.core.AbortMultipartUpload(ctx, d.bucket, key, id)
	var er minio.ErrorResponse
	if errors.As(err, &er) && er.Code == minio.NoSuchUpload {
		return nil
	}
	if err != nil {
		return fmt.Errorf("s3: abort upload %s: %w", key, err)
	}
	return nil
}

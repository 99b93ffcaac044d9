// Package backend defines the storage driver interface every ckptkit backend
// implements, the portable Store that wraps a driver (error classification,
// key validation, prefixing, retries), and the URL registry that picks a
// driver from a URL's scheme at run time.
//
// A driver is deliberately small and easy to get right; everything that must
// behave the same on every backend lives in Store. The conformance package
// checks that a driver plus Store obey the semantics documented here.
package backend

import (
	"context"
	"io"
	"time"
)

// Driver is the interface a storage backend implements. Keys passed to a
// driver are already validated and prefixed by the Store: valid UTF-8,
// slash-separated, relative, with no empty, "." or ".." segments and no NUL
// byte.
//
// Every method honours ctx: cancellation stops work promptly and, for Put,
// publishes nothing.
type Driver interface {
	// NewRangeReader opens key for reading length bytes from offset; a
	// negative length reads to the end. An offset at or past the end yields
	// an empty reader, not an error. A missing key is CodeNotFound.
	NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)

	// Put writes exactly size bytes read from r to key. The object is
	// invisible until Put returns nil: if r fails, delivers other than size
	// bytes, or ctx is cancelled, the previous object (or nothing) stays in
	// place. With opts.IfNotExists set, Put fails with CodeAlreadyExists when
	// the key exists (drivers without Capabilities.CreateIfAbsent are never
	// asked). r is consumed once; the Store handles retries. Through a
	// Store, r is an exact-size body: it yields exactly size bytes and then
	// io.EOF, or fails (a short or over-long source, a cancelled ctx), and
	// the Store is the one place that checks this; a driver only has to
	// publish nothing when r fails. The body may be an io.WriterTo (for a
	// SlicesReader or bytes.Reader source), which writes the caller's
	// bytes to the writer given without an intermediate buffer.
	Put(ctx context.Context, key string, size int64, r io.Reader, opts PutOptions) error

	// Stat returns the attributes of key, or CodeNotFound.
	Stat(ctx context.Context, key string) (Attributes, error)

	// List calls fn for every object whose key starts with prefix, in
	// ascending byte order of key, streaming (it must not collect the whole
	// listing first when the backend pages). If fn returns an error, List
	// stops and returns it.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error

	// ListDelimited is the one-level ("/"-delimited) listing under prefix
	// ("" or ending in "/"): it calls fn once for every object whose key
	// after prefix holds no "/", and once for every deeper level that holds
	// at least one object, as an ObjectInfo with IsPrefix set, Key the
	// common prefix including its trailing "/" and zero Size and ModTime.
	// Objects below a common prefix are not enumerated (natively: S3 and
	// GCS delimiter queries, a directory read on a file system). Entries
	// come in no guaranteed order (object stores return objects and common
	// prefixes in separate lists). If fn returns an error, ListDelimited
	// stops and returns it.
	ListDelimited(ctx context.Context, prefix string, fn func(ObjectInfo) error) error

	// Delete removes key. Deleting a missing key succeeds.
	Delete(ctx context.Context, key string) error

	// Capabilities declares what the driver supports.
	Capabilities() Capabilities

	// ErrorCode classifies an error returned by this driver.
	ErrorCode(err error) Code

	// Close releases the driver's resources.
	Close() error
}

// PutOptions tune a single Put.
type PutOptions struct {
	// IfNotExists makes the write fail with CodeAlreadyExists when the key
	// already exists (create-if-absent), atomically where the backend can.
	IfNotExists bool
	// CRC32C, when non-nil, is the Castagnoli CRC of the whole body; drivers
	// that can send it for server-side verification do so.
	CRC32C *uint32
	// ContentType is a hint for backends that store one.
	ContentType string
}

// Attributes describe a stored object.
type Attributes struct {
	Size    int64
	ModTime time.Time
	// CRC32C is the stored Castagnoli checksum when the backend keeps one.
	CRC32C *uint32
}

// ObjectInfo is one listing entry. Key is relative to the listed Store.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
	// IsPrefix marks a common prefix of a delimited listing (Key ends in
	// "/"); List never sets it.
	IsPrefix bool
}

// Delimiter separates the levels of a key for ListDelimited.
const Delimiter = "/"

// Capabilities is what a driver declares it can do.
type Capabilities struct {
	// CreateIfAbsent: Put honours IfNotExists atomically.
	CreateIfAbsent bool
	// ServerCRC32C: the backend verifies PutOptions.CRC32C on upload.
	ServerCRC32C bool
	// Multipart: large objects are uploaded in parts; PartSize and
	// Concurrency are the configured values (0 where not applicable).
	Multipart   bool
	PartSize    int64
	Concurrency int
	// StreamedPutBytes: a Put of at most this many bytes streams its body
	// to the service as it reads it, without a copy in a buffer of the
	// driver's or its SDK's (0: no such promise; a driver copies a body
	// into part buffers or upload chunks above it). The async saver stages
	// objects up to this size in its budget without room for a copy.
	StreamedPutBytes int64
}

// Remainer is implemented by readers that know, before the first Read, how
// many bytes they will deliver (the object's size, or the length of the
// range, from the response that opened it). Store.ReadAll uses it to refuse
// an object over its limit without reading it. Remain returns the bytes
// still to come, or -1 when unknown.
type Remainer interface {
	Remain() int64
}

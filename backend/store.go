package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/keys"
)

// RetryPolicy says how a Store retries transient failures. The Store is the
// one owner of retries: drivers configure their SDKs for a single attempt
// (minio-go MaxRetries 1, a never-retry predicate on the GCS client), and
// a driver that retries a smaller unit (an S3 upload part) does so with
// RetryWithin, under this policy, and a unit that used up its attempts
// ends the call's retries. So a request that keeps failing is tried
// Attempts times in all, never Attempts times the SDK's count. Only
// calls whose body can be replayed (reads, stats, lists before their first
// entry, and writes whose source is an io.Seeker) are retried.
type RetryPolicy struct {
	// Attempts is the total number of tries of one request: of a call,
	// or of one part of it that a driver retries (1 disables retries).
	Attempts int
	// BaseDelay is the first backoff; it doubles per retry, with jitter
	// (see Backoff).
	BaseDelay time.Duration
	// MaxDelay caps one backoff.
	MaxDelay time.Duration
	// Budget, when positive, bounds the time from a call's first attempt
	// after which no further retry starts.
	Budget time.Duration
}

// DefaultRetryPolicy is used by Open and NewStore.
// It has no time Budget: an attempt of a multi-GiB upload may itself take
// minutes, and a transient failure at its end deserves its retries.
var DefaultRetryPolicy = RetryPolicy{Attempts: 4, BaseDelay: 100 * time.Millisecond, MaxDelay: 3 * time.Second}

// Store is the portable handle on a driver rooted at a prefix. It validates
// keys before any driver sees them, joins them to its prefix, classifies
// every driver error once into a *Error matching the package sentinels, and
// retries transient failures. A Store is safe for concurrent use.
type Store struct {
	drv    Driver
	base   string // redacted URL of the driver root, without trailing slash
	prefix string // "" or ends with "/"
	query  string // the URL's query without credential-like options, or ""
	retry  RetryPolicy
	stall  time.Duration // no-progress deadline of one request (0: none)
}

// NewStore wraps drv. baseURL names the driver's root in messages (it is
// redacted here); prefix, which may be empty, is prepended to every key.
func NewStore(drv Driver, baseURL, prefix string) (*Store, error) {
	p, err := cleanPrefix(prefix)
	if err != nil {
		return nil, fmt.Errorf("store prefix %q: %w", prefix, err)
	}
	base := RedactURL(baseURL)
	if !strings.HasSuffix(base, "://") {
		base = strings.TrimSuffix(base, "/")
	}
	return &Store{drv: drv, base: base, prefix: p, retry: DefaultRetryPolicy, stall: DefaultStallTimeout}, nil
}

// Driver returns the underlying driver.
func (s *Store) Driver() Driver { return s.drv }

// WithDriver returns a copy of s that uses drv (for instance an instrumented
// wrapper of s.Driver()) with the same URL, prefix and retry policy.
func (s *Store) WithDriver(drv Driver) *Store {
	c := *s
	c.drv = drv
	return &c
}

// WithRetry returns a copy of s with another retry policy.
func (s *Store) WithRetry(p RetryPolicy) *Store {
	c := *s
	if p.Attempts < 1 {
		p.Attempts = 1
	}
	c.retry = p
	return &c
}

// WithStallTimeout returns a copy of s whose requests fail as stalled
// (a *StallError, transient, retried under the policy) when they make no
// progress for d: no byte sent or received. d <= 0 turns the deadline
// off. The drivers that watch their requests (S3, GCS: backend/stall)
// honour it; Open sets it from the URL option stall_timeout, else
// CKPTKIT_STALL_TIMEOUT, else DefaultStallTimeout.
func (s *Store) WithStallTimeout(d time.Duration) *Store {
	c := *s
	c.stall = max(d, 0)
	return &c
}

// StallTimeout returns the store's stall timeout (0: none).
func (s *Store) StallTimeout() time.Duration { return s.stall }

// Sub returns a Store rooted at prefix below s.
func (s *Store) Sub(prefix string) (*Store, error) {
	p, err := cleanPrefix(prefix)
	if err != nil {
		return nil, &Error{Op: "sub", URL: s.URL(prefix), Code: CodeInvalidKey, Err: err}
	}
	c := *s
	c.prefix = s.prefix + p
	return &c, nil
}

// Prefix returns the store's key prefix inside its driver ("" or ending in "/").
func (s *Store) Prefix() string { return s.prefix }

// URL returns the redacted URL of key below the store (key may be ""):
// it keeps the query options the store was opened with (an S3 endpoint,
// region, path_style, insecure), so that it opens the same storage when
// fed back to Open, and drops credential-like ones (NonSecretQuery).
func (s *Store) URL(key string) string {
	return s.withQuery(s.base + "/" + s.prefix + key)
}

// String returns the redacted URL of the store's root, with its
// non-secret query options (see URL).
func (s *Store) String() string {
	return s.withQuery(strings.TrimSuffix(s.base+"/"+s.prefix, "/"))
}

func (s *Store) withQuery(u string) string {
	if s.query == "" {
		return u
	}
	return u + "?" + s.query
}

// Capabilities returns the driver's declared capabilities.
func (s *Store) Capabilities() Capabilities { return s.drv.Capabilities() }

// Close closes the driver.
func (s *Store) Close() error { return s.drv.Close() }

// wrap classifies a driver error of a call made under ctx, the caller's
// context (with the Store's values), into a *Error.
func (s *Store) wrap(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	code := s.drv.ErrorCode(err)
	if code == CodeUnknown {
		code = CodeOf(err)
	}
	if code == CodeCanceled && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		// A deadline while the caller's context is live is a bound a
		// driver put on one of its own requests (a multipart upload's
		// start, its completion, a clean-up) running out: storage was too
		// slow, nobody cancelled anything. Classed as a cancellation it
		// read as an interrupt (exit 130, issue 30).
		code = CodeTransient
		err = fmt.Errorf("%w (a bound of the driver's own ran out; the caller did not cancel)", err)
	}
	return &Error{Op: op, URL: s.URL(key), Code: code, Err: err}
}

func (s *Store) full(key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", &Error{Op: "validate", URL: s.URL(key), Code: CodeInvalidKey, Err: err}
	}
	return s.prefix + key, nil
}

// retryLoop runs f until it succeeds, fails permanently, ctx ends or the
// retry budget is spent. f returns a classified error; the ctx it is given
// carries the budget, for drivers that retry parts (RetryWithin).
func (s *Store) retryLoop(ctx context.Context, f func(ctx context.Context) error) error {
	bctx, b := s.withBudget(ctx)
	return retryEach(ctx, s.retry, func(err error) bool {
		if !b.take() {
			return false
		}
		slog.DebugContext(ctx, "storage retry", "store", s.String(), "error", err)
		return true
	}, func() error { return f(bctx) })
}

// withBudget returns ctx carrying a fresh retry budget of s's policy for
// one call and the store's stall timeout, and the budget.
func (s *Store) withBudget(ctx context.Context) (context.Context, *budget) {
	b := &budget{policy: s.retry}
	b.left.Store(int64(max(s.retry.Attempts, 1) - 1))
	if s.retry.Budget > 0 {
		b.deadline = time.Now().Add(s.retry.Budget)
	}
	return ContextWithStallTimeout(context.WithValue(ctx, budgetKey{}, b), s.stall), b
}

// NewRangeReader opens length bytes of key from offset (length < 0: to the
// end). Opening is retried on transient errors; the stream itself is not.
func (s *Store) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := s.retryLoop(ctx, func(ctx context.Context) error {
		var e error
		rc, e = s.open(ctx, key, offset, length)
		return e
	})
	return rc, err
}

// open is one attempt of NewRangeReader.
func (s *Store) open(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	full, err := s.full(key)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, &Error{Op: "read", URL: s.URL(key), Code: CodeInvalidKey, Err: fmt.Errorf("negative offset %d", offset)}
	}
	rc, err := s.drv.NewRangeReader(ctx, full, offset, length)
	if err != nil {
		return nil, s.wrap(ctx, "read", key, err)
	}
	return &wrappedReader{rc: rc, s: s, key: key, ctx: ctx}, nil
}

type wrappedReader struct {
	rc  io.ReadCloser
	s   *Store
	key string
	ctx context.Context // the caller's, to classify errors
}

func (w *wrappedReader) Read(p []byte) (int, error) {
	n, err := w.rc.Read(p)
	if err != nil && err != io.EOF {
		err = w.s.wrap(w.ctx, "read", w.key, err)
	}
	return n, err
}

// Remain implements Remainer when the driver's reader does (-1 otherwise).
func (w *wrappedReader) Remain() int64 {
	if r, ok := w.rc.(Remainer); ok {
		return r.Remain()
	}
	return -1
}

func (w *wrappedReader) Close() error { return w.s.wrap(w.ctx, "close", w.key, w.rc.Close()) }

// ReadRange reads exactly len(dst) bytes of key at offset into dst. A short
// object is an io.ErrUnexpectedEOF naming the key.
func (s *Store) ReadRange(ctx context.Context, key string, offset int64, dst []byte) error {
	return s.ReadRangeInto(ctx, key, offset, [][]byte{dst}, nil)
}

// A Tap sees the bytes of a ReadRangeInto in order, piece by piece, right
// after each piece lands in its destination (while it is still in the CPU
// cache): a checksum computed there costs no second pass over memory.
// Reset is called before every attempt, so a retried read starts over.
type Tap interface {
	io.Writer
	Reset()
}

// TapPiece is the most ReadRangeInto reads before handing the bytes to its
// Tap: small enough to stay in a core's L2 cache, large enough for few
// system calls.
const TapPiece = 256 << 10

// ReadRangeInto reads the bytes of key from offset on, as one ranged read,
// into dsts in turn (each filled exactly; the range is the sum of their
// lengths), so one request can scatter consecutive chunks straight into
// separate buffers. With a tap, every piece (at most TapPiece bytes) is
// written into it as soon as it is read. Opening is retried on transient
// errors, and so is the whole read.
func (s *Store) ReadRangeInto(ctx context.Context, key string, offset int64, dsts [][]byte, tap Tap) error {
	var n int64
	for _, d := range dsts {
		n += int64(len(d))
	}
	return s.retryLoop(ctx, func(ctx context.Context) error {
		rc, err := s.open(ctx, key, offset, n)
		if err != nil {
			return err
		}
		defer rc.Close()
		// A response that announced the whole range but ended early was
		// cut in transit (a transient failure, retried); one that announced
		// less, or a stream of unknown length that ends early, is a short
		// object.
		announced := rc.(Remainer).Remain()
		if tap != nil {
			tap.Reset()
		}
		var got int64
		for _, dst := range dsts {
			var k int
			if tap == nil {
				k, err = io.ReadFull(rc, dst)
				got += int64(k)
			}
			for p := 0; tap != nil && p < len(dst) && err == nil; p += TapPiece {
				k, err = readTapped(rc, dst[p:min(p+TapPiece, len(dst))], tap)
				got += int64(k)
			}
			if err != nil {
				break
			}
		}
		if err != nil {
			if (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && announced >= n {
				return &Error{Op: "read", URL: s.URL(key), Code: CodeTransient,
					Err: fmt.Errorf("connection ended after %d of %d announced bytes: %w", got, announced, io.ErrUnexpectedEOF)}
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return &Error{Op: "read", URL: s.URL(key), Code: CodeUnknown,
					Err: fmt.Errorf("object shorter than range [%d,%d): %w", offset, offset+n, io.ErrUnexpectedEOF)}
			}
			return s.wrap(ctx, "read", key, err)
		}
		return nil
	})
}

// readTapped fills buf from r like io.ReadFull, handing tap the bytes of
// every Read as soon as it returns (a socket delivers a piece in many
// reads; a file in one), so the tap sees them while they are most likely
// still in the cache.
func readTapped(r io.Reader, buf []byte, tap Tap) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		if k > 0 {
			if _, terr := tap.Write(buf[n : n+k]); terr != nil {
				return n, terr
			}
			n += k
		}
		switch {
		case n == len(buf):
			return n, nil
		case err == io.EOF && n == 0:
			return 0, io.EOF
		case err == io.EOF:
			return n, io.ErrUnexpectedEOF
		case err != nil:
			return n, err
		}
	}
	return n, nil
}

// ReadAll reads the whole object, refusing objects larger than limit bytes
// (limit <= 0: no limit).
func (s *Store) ReadAll(ctx context.Context, key string, limit int64) ([]byte, error) {
	return s.ReadAllFrom(ctx, key, 0, limit)
}

// ReadAllFrom reads the object from offset to its end, as one ranged read
// (the bytes before offset are not transferred), refusing more than limit
// bytes (limit <= 0: no limit).
func (s *Store) ReadAllFrom(ctx context.Context, key string, offset, limit int64) ([]byte, error) {
	var out []byte
	err := s.retryLoop(ctx, func(ctx context.Context) error {
		rc, err := s.open(ctx, key, offset, -1)
		if err != nil {
			return err
		}
		defer rc.Close()
		r := io.Reader(rc)
		announced := rc.(Remainer).Remain()
		if limit > 0 {
			// An object known to be over the limit is refused unread.
			if announced > limit {
				return &Error{Op: "read", URL: s.URL(key), Code: CodeUnknown, Err: fmt.Errorf("%w: %d bytes, over %d", ErrObjectTooLarge, announced, limit)}
			}
			r = io.LimitReader(rc, limit+1)
		}
		out, err = readAllSized(r, announced)
		if err != nil {
			return err
		}
		if limit > 0 && int64(len(out)) > limit {
			return &Error{Op: "read", URL: s.URL(key), Code: CodeUnknown, Err: fmt.Errorf("%w: over %d bytes", ErrObjectTooLarge, limit)}
		}
		return nil
	})
	return out, err
}

// readAllSized reads r to its end into one buffer of n+1 bytes when n, the
// size r announced, is known (io.ReadAll grows its buffer by copies and
// keeps up to a quarter more capacity than it fills: a 759 MiB metadata
// object held 950 MiB); it grows only when r delivers more.
func readAllSized(r io.Reader, n int64) ([]byte, error) {
	if n < 0 {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, n+1) // +1: reading the end needs no growth
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// Put writes exactly size bytes from r to key; see Driver.Put for the
// atomicity contract. The Store enforces the declared size itself: a source
// that ends early or delivers more fails with ErrSizeMismatch and nothing is
// published. When r is an io.Seeker, transient failures are retried after
// rewinding it. When r also knows its length and can write itself
// (Len and WriteTo: a SlicesReader, a bytes.Reader), a length other than
// size is refused before a driver's WriteTo sends anything (a driver that
// reads the body instead finds it at the end, as with any source), and the driver's body has a
// WriteTo too, so a driver writing to a file takes the caller's bytes
// directly.
func (s *Store) Put(ctx context.Context, key string, size int64, r io.Reader, opts PutOptions) error {
	full, err := s.full(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return &Error{Op: "write", URL: s.URL(key), Code: CodeSizeMismatch, Err: fmt.Errorf("negative size %d", size)}
	}
	if opts.IfNotExists && !s.drv.Capabilities().CreateIfAbsent {
		return &Error{Op: "write", URL: s.URL(key), Code: CodeUnsupported, Err: errors.New("create-if-absent not supported")}
	}
	seeker, canRewind := r.(io.ReadSeeker)
	var start int64
	if canRewind {
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			canRewind = false
		}
	}
	attempt := func(ctx context.Context) error {
		sr := &sizedReader{ctx: ctx, r: r, remaining: size}
		var body io.Reader = sr
		if wt, ok := r.(lenWriterTo); ok && size > 0 {
			body = &sizedWriterTo{sizedReader: sr, src: wt}
		}
		if size == 0 {
			// A driver may publish an empty object without reading the body
			// at all, so an over-long source must be caught here, first.
			if err := sr.checkExhausted(); err != io.EOF {
				return &Error{Op: "write", URL: s.URL(key), Code: CodeOf(err), Err: err}
			}
		}
		err := s.drv.Put(ctx, full, size, body, opts)
		// The attempt is over: a late read by the driver (net/http may read
		// or drain a request body in another goroutine after RoundTrip
		// returned) must not take bytes from the next attempt's stream.
		srErr := sr.fence()
		if srErr != nil && err != nil {
			// The source's failure is the cause (the driver's error only
			// echoes it); a cancellation that came first is said too.
			if cerr := ctx.Err(); cerr != nil && !errors.Is(srErr, cerr) {
				return &Error{Op: "write", URL: s.URL(key), Code: CodeCanceled, Err: fmt.Errorf("%w; source: %w", cerr, srErr)}
			}
			return &Error{Op: "write", URL: s.URL(key), Code: CodeOf(srErr), Err: srErr}
		}
		if err == nil && srErr != nil {
			// A driver that ignored the source error published something:
			// that is a driver bug, surfaced loudly.
			return &Error{Op: "write", URL: s.URL(key), Code: CodeUnknown, Err: fmt.Errorf("driver published despite source error: %w", srErr)}
		}
		return s.wrap(ctx, "write", key, err)
	}
	if !canRewind {
		// A body that cannot be replayed gets one attempt, and its real
		// error; the driver may still retry parts it buffered itself.
		bctx, _ := s.withBudget(ctx)
		return attempt(bctx)
	}
	retried := false
	err = s.retryLoop(ctx, func(ctx context.Context) error {
		if retried {
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return &Error{Op: "write", URL: s.URL(key), Code: CodeUnknown, Err: fmt.Errorf("rewind source: %w", err)}
			}
		}
		err := attempt(ctx)
		if retried && opts.IfNotExists && errors.Is(err, ErrAlreadyExists) {
			// The failed attempt may have committed before its response was
			// lost: if the object holds exactly our bytes, the write is ours.
			if same, serr := s.holds(ctx, key, size, seeker, start); serr == nil && same {
				return nil
			}
		}
		retried = true
		return err
	})
	return err
}

// holds reports whether key holds exactly the size bytes that r yields
// from start (r is rewound first).
func (s *Store) holds(ctx context.Context, key string, size int64, r io.ReadSeeker, start int64) (bool, error) {
	a, err := s.Stat(ctx, key)
	if err != nil || a.Size != size {
		return false, err
	}
	if _, err := r.Seek(start, io.SeekStart); err != nil {
		return false, err
	}
	rc, err := s.open(ctx, key, 0, size)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	const chunk = 1 << 20
	a1, a2 := make([]byte, chunk), make([]byte, chunk)
	for left := size; left > 0; {
		n := min(left, chunk)
		if _, err := io.ReadFull(rc, a1[:n]); err != nil {
			return false, err
		}
		if _, err := io.ReadFull(r, a2[:n]); err != nil {
			return false, err
		}
		if !bytes.Equal(a1[:n], a2[:n]) {
			return false, nil
		}
		left -= n
	}
	return true, nil
}

// PutBytes writes data to key (retryable, since the body rewinds).
func (s *Store) PutBytes(ctx context.Context, key string, data []byte, opts PutOptions) error {
	return s.Put(ctx, key, int64(len(data)), bytes.NewReader(data), opts)
}

// sizedReader delivers exactly remaining bytes of r or fails with
// ErrSizeMismatch: on an early EOF, and when r holds more than declared. It
// also stops the body as soon as ctx ends, so no driver can finish sending
// (and publish) a write whose context was cancelled midway.
type sizedReader struct {
	ctx       context.Context
	r         io.Reader
	remaining int64
	err       error
	// mu is held by every Read and WriteTo of the source and by fence, so
	// that once fence returns, no caller of this attempt's body touches r
	// again.
	mu     sync.Mutex
	fenced bool
}

// errAttemptOver is what a body yields to a read that comes after its
// write attempt returned.
var errAttemptOver = errors.New("read of a write attempt's body after the attempt returned")

// fence ends the attempt: later reads fail without touching the source. It
// returns the source's error as of the attempt's end.
func (z *sizedReader) fence() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.fenced = true
	return z.err
}

// lock takes z.mu and returns why the body can no longer be read: its
// attempt is over, or the source already failed. The caller unlocks.
func (z *sizedReader) lock() error {
	z.mu.Lock()
	if z.fenced {
		return errAttemptOver
	}
	return z.err
}

func (z *sizedReader) Read(p []byte) (int, error) {
	defer z.mu.Unlock()
	if err := z.lock(); err != nil {
		return 0, err
	}
	if err := z.ctx.Err(); err != nil {
		z.err = err
		return 0, err
	}
	if z.remaining == 0 {
		return 0, z.checkExhausted()
	}
	if int64(len(p)) > z.remaining {
		p = p[:z.remaining]
	}
	n, err := z.r.Read(p)
	z.remaining -= int64(n)
	switch {
	case err == io.EOF && z.remaining > 0:
		z.err = fmt.Errorf("source ended %d bytes early: %w", z.remaining, ErrSizeMismatch)
		return n, z.err
	case err != nil && err != io.EOF:
		z.err = fmt.Errorf("source: %w", err)
		return n, z.err
	}
	if z.remaining == 0 {
		if err := z.checkExhausted(); err != io.EOF {
			return n, err
		}
		return n, io.EOF
	}
	return n, nil
}

// lenWriterTo is a Put source that knows how many bytes it still holds
// and can write them itself (SlicesReader, bytes.Reader): the Store checks
// its length against the declared size up front and hands the driver a
// body with a WriteTo, so a driver that writes to a file can take the
// caller's bytes directly instead of copying them through a buffer.
type lenWriterTo interface {
	io.WriterTo
	Len() int
}

// sizedWriterTo is the exact-size body of a lenWriterTo source: Read as
// sizedReader, plus a WriteTo that refuses a source of another length
// before writing anything and stops between writes once ctx ends.
type sizedWriterTo struct {
	*sizedReader
	src lenWriterTo
}

// WriteTo implements io.WriterTo. An error of w is returned as is (the
// destination failed, not the source); a source of the wrong length or a
// cancelled ctx is the source's error, as with Read.
func (z *sizedWriterTo) WriteTo(w io.Writer) (int64, error) {
	defer z.mu.Unlock()
	if err := z.lock(); err != nil {
		return 0, err
	}
	if n := int64(z.src.Len()); n != z.remaining {
		z.err = fmt.Errorf("source holds %d bytes, %d declared: %w", n, z.remaining, ErrSizeMismatch)
		return 0, z.err
	}
	n, err := z.src.WriteTo(ctxWriter{z: z.sizedReader, w: w})
	z.remaining -= n
	if err == nil && z.remaining != 0 {
		z.err = fmt.Errorf("source ended %d bytes early: %w", z.remaining, ErrSizeMismatch)
		err = z.err
	}
	return n, err
}

// ctxWriter fails a write once z's context has ended, recording the
// cancellation as the source's error (as sizedReader.Read does).
type ctxWriter struct {
	z *sizedReader
	w io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.z.ctx.Err(); err != nil {
		c.z.err = err
		return 0, err
	}
	return c.w.Write(p)
}

// checkExhausted peeks one byte past the declared size.
func (z *sizedReader) checkExhausted() error {
	var b [1]byte
	for {
		n, err := z.r.Read(b[:])
		if n > 0 {
			z.err = fmt.Errorf("source holds more than the declared size: %w", ErrSizeMismatch)
			return z.err
		}
		if err == io.EOF {
			return io.EOF
		}
		if err != nil {
			z.err = fmt.Errorf("source: %w", err)
			return z.err
		}
	}
}

// Stat returns key's attributes.
func (s *Store) Stat(ctx context.Context, key string) (Attributes, error) {
	full, err := s.full(key)
	if err != nil {
		return Attributes{}, err
	}
	var a Attributes
	err = s.retryLoop(ctx, func(ctx context.Context) error {
		var e error
		a, e = s.drv.Stat(ctx, full)
		return s.wrap(ctx, "stat", key, e)
	})
	return a, err
}

// Exists reports whether key exists.
func (s *Store) Exists(ctx context.Context, key string) (bool, error) {
	_, err := s.Stat(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// List calls fn for every object under prefix (relative to the store), in
// ascending key order. Keys given to fn are relative to the store.
func (s *Store) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	p, err := cleanListPrefix(prefix)
	if err != nil {
		return &Error{Op: "list", URL: s.URL(prefix), Code: CodeInvalidKey, Err: err}
	}
	return s.list(ctx, "list", prefix, p, s.drv.List, fn)
}

// ListDelimited lists one level under prefix ("" or ending in "/",
// relative to the store): every object directly under it, and every
// deeper level once as an ObjectInfo with IsPrefix set and Key ending in
// "/" (see Driver.ListDelimited), without enumerating the objects below
// those levels. Entries come in no guaranteed order.
func (s *Store) ListDelimited(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	p, err := cleanListPrefix(prefix)
	if err == nil && p != "" && !strings.HasSuffix(p, Delimiter) {
		err = fmt.Errorf("delimited listing prefix %q must be empty or end in %q: %w", prefix, Delimiter, ErrInvalidKey)
	}
	if err != nil {
		return &Error{Op: "list", URL: s.URL(prefix), Code: CodeInvalidKey, Err: err}
	}
	return s.list(ctx, "list", prefix, p, s.drv.ListDelimited, fn)
}

// list runs one driver listing of s.prefix+p with the Store's retry rule.
func (s *Store) list(ctx context.Context, op, prefix, p string, drvList func(context.Context, string, func(ObjectInfo) error) error, fn func(ObjectInfo) error) error {
	// A listing is retried only while nothing has been delivered: after
	// that a failure is returned, never a silently shortened listing.
	started := false
	var fnErr error
	errStarted := errors.New("listing failed after entries were delivered")
	err := s.retryLoop(ctx, func(ctx context.Context) error {
		e := drvList(ctx, s.prefix+p, func(o ObjectInfo) error {
			started = true
			o.Key = strings.TrimPrefix(o.Key, s.prefix)
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(o); err != nil {
				fnErr = err
				return err
			}
			return nil
		})
		switch {
		case fnErr != nil:
			return &Error{Op: op, URL: s.URL(prefix), Code: CodeUnknown, Err: fnErr}
		case e != nil && started:
			if w := s.wrap(ctx, op, prefix, e); !IsTransient(w) {
				return w
			}
			return &Error{Op: op, URL: s.URL(prefix), Code: CodeUnknown, Err: fmt.Errorf("%w: %w", errStarted, e)}
		}
		return s.wrap(ctx, op, prefix, e)
	})
	if fnErr != nil {
		return fnErr
	}
	return err
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	full, err := s.full(key)
	if err != nil {
		return err
	}
	return s.retryLoop(ctx, func(ctx context.Context) error {
		e := s.wrap(ctx, "delete", key, s.drv.Delete(ctx, full))
		if errors.Is(e, ErrNotFound) {
			return nil
		}
		return e
	})
}

// ValidateKey is keys.Validate, the one key syntax, for driver authors: a
// clean relative slash-separated key in valid UTF-8, not empty, not
// absolute, no NUL, no empty, "." or ".." segments. Its errors wrap
// ErrInvalidKey.
func ValidateKey(key string) error { return keys.Validate(key) }

// cleanPrefix validates a store prefix and returns it with one trailing
// slash ("" stays "").
func cleanPrefix(p string) (string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return "", nil
	}
	if err := ValidateKey(p); err != nil {
		return "", err
	}
	return path.Clean(p) + "/", nil
}

// cleanListPrefix validates a listing prefix, which may be empty or end in "/".
func cleanListPrefix(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if err := ValidateKey(strings.TrimSuffix(p, "/")); err != nil {
		return "", err
	}
	return p, nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

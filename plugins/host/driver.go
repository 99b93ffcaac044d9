package host

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
)

// driver is the host-side backend.Driver that forwards every call to a
// plugin process. It holds the URL it was opened with, so that after a
// plugin restart it re-opens the URL on the new process before the next call.
type driver struct {
	p   *Plugin
	url string // full URL, credentials included; never printed

	mu     sync.Mutex
	gen    uint64 // instance generation handle belongs to
	handle string
	caps   backend.Capabilities
	closed bool
}

var _ backend.Driver = (*driver)(nil)

// open opens the URL on the current instance and returns the prefix.
func (d *driver) open(ctx context.Context) (string, error) {
	in, err := d.p.live(ctx)
	if err != nil {
		return "", err
	}
	cctx, cancel := in.callCtx(ctx)
	defer cancel()
	resp, err := in.rpc.Open(cctx, &pb.OpenRequest{Url: d.url})
	if err != nil {
		return "", d.p.convert(ctx, in, "open", err, crashRetryable)
	}
	d.mu.Lock()
	d.gen, d.handle, d.caps = in.gen, resp.GetHandle(), capsFromPB(resp.GetCapabilities())
	d.mu.Unlock()
	return resp.GetPrefix(), nil
}

// bind returns a live instance and this driver's handle on it, re-opening
// the URL when the plugin was restarted since.
func (d *driver) bind(ctx context.Context) (*instance, string, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, "", &CallError{Plugin: d.p.Name, Op: "call", Code: backend.CodeUnknown, Err: errors.New("driver is closed")}
	}
	for attempt := 0; ; attempt++ {
		in, err := d.p.live(ctx)
		if err != nil {
			return nil, "", err
		}
		d.mu.Lock()
		gen, h := d.gen, d.handle
		d.mu.Unlock()
		if gen == in.gen {
			return in, h, nil
		}
		if _, err := d.open(ctx); err != nil {
			if attempt == 0 && errors.Is(err, ErrPluginExited) {
				continue // died again between live and open: one more go
			}
			return nil, "", err
		}
	}
}

func capsFromPB(c *pb.Caps) backend.Capabilities {
	return backend.Capabilities{
		CreateIfAbsent: c.GetCreateIfAbsent(),
		ServerCRC32C:   c.GetServerCrc32C(),
		Multipart:      c.GetMultipart(),
		PartSize:       c.GetPartSize(),
		Concurrency:    int(c.GetConcurrency()),
	}
}

// NewRangeReader implements backend.Driver. It waits for the plugin's first
// frame, so a missing key fails here and not on the first Read. Ranges of
// unknown or at least shmThreshold bytes go over the shared-memory path
// when the plugin process accepted it.
func (d *driver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	in, h, err := d.bind(ctx)
	if err != nil {
		return nil, err
	}
	req := &pb.ReadRequest{Handle: h, Key: key, Offset: offset, Length: length}
	if length < 0 || length >= shmThreshold {
		if seg := in.sharedMemory(); seg != nil {
			return d.readShm(ctx, in, seg, req)
		}
	}
	cctx, cancel := in.callCtx(ctx)
	stream, err := in.rpc.Read(cctx, req)
	if err != nil {
		cancel()
		return nil, d.p.convert(ctx, in, "read", err, crashRetryable)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if err == io.EOF {
			err = errors.New("read stream ended before its first frame")
		}
		return nil, d.p.convert(ctx, in, "read", err, crashRetryable)
	}
	return &reader{d: d, in: in, ctx: ctx, cctx: cctx, recv: stream.Recv, cancel: cancel, buf: first.GetData(), slot: -1}, nil
}

// reader reads a range from a Read or ReadShm stream. Its stream (and the
// context watching the plugin process) are released at EOF, on error and
// on Close, as is its reference on the shared segment.
type reader struct {
	d      *driver
	in     *instance
	ctx    context.Context // the caller's
	cctx   context.Context // the call's: ctx, ended also by the plugin's exit
	recv   func() (*pb.ReadChunk, error)
	cancel context.CancelFunc
	buf    []byte
	err    error

	// The shared-memory path: seg is nil on a plain Read stream.
	seg  *shm.Segment
	ack  func(slot uint32) error
	slot int64 // read slot buf points into, -1 for none
}

// Read implements io.Reader.
func (r *reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.release()
		msg, err := r.recv()
		switch {
		case err == io.EOF:
			r.end(io.EOF)
		case err != nil:
			r.end(r.d.p.convert(r.ctx, r.in, "read", err, crashRetryable))
		default:
			r.take(msg)
		}
	}
	n := copy(p, r.buf)
	if r.slot >= 0 && r.cctx.Err() != nil {
		// The call ended during the copy: the plugin may have reused the
		// slot under it, so these bytes are not trusted.
		r.end(r.d.p.convert(r.ctx, r.in, "read", context.Cause(r.cctx), crashRetryable))
		return 0, r.err
	}
	r.buf = r.buf[n:]
	if len(r.buf) == 0 {
		r.release() // let the plugin refill the slot while the caller works
	}
	return n, nil
}

// take accepts a chunk: inline bytes, or a bounds-checked read slot.
func (r *reader) take(msg *pb.ReadChunk) {
	ref := msg.GetShm()
	if ref == nil {
		r.buf = msg.GetData()
		return
	}
	if r.seg == nil || len(msg.GetData()) > 0 {
		r.end(&CallError{Plugin: r.d.p.Name, Op: "read", Code: backend.CodeUnknown, Err: errors.New("plugin sent a malformed read chunk")})
		return
	}
	b, err := r.seg.ReadRef(ref.GetSlot(), ref.GetLength())
	if err != nil {
		r.end(&CallError{Plugin: r.d.p.Name, Op: "read", Code: backend.CodeUnknown, Err: fmt.Errorf("plugin sent a bad read chunk: %w", err)})
		return
	}
	r.buf, r.slot = b, int64(ref.GetSlot())
}

// release acknowledges the read slot the drained buffer pointed into. A
// failed acknowledgement means the stream ended; the next receive reports
// why.
func (r *reader) release() {
	if r.slot < 0 {
		return
	}
	slot := uint32(r.slot)
	r.slot = -1
	_ = r.ack(slot)
}

// end finishes the reader with err: the call and the segment reference
// are released and no slot is read any more.
func (r *reader) end(err error) {
	r.err = err
	r.buf, r.slot = nil, -1
	r.cancel()
	if r.seg != nil {
		r.seg.Release()
		r.seg = nil
	}
}

// Close implements io.Closer; it cancels the stream if still open.
func (r *reader) Close() error {
	if r.err == nil {
		r.end(errors.New("read from a closed reader"))
	}
	return nil
}

// Put implements backend.Driver: a header frame, ChunkSize data frames read
// from r, then the commit frame with the byte count and CRC32C. If r fails,
// delivers other than size bytes, or ctx ends, the stream is cancelled (on
// the shared-memory path: closed) without a commit frame and the plugin
// publishes nothing.
//
// A plugin crash is retryable (CodeTransient) only before the first data
// frame: after that the source was partly consumed and the write is never
// replayed here (see crashNotCommitted and crashAmbiguous). Put reads r
// on the calling goroutine, so it returns once a blocked r.Read returns:
// sources should honour ctx too.
func (d *driver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	in, h, err := d.bind(ctx)
	if err != nil {
		return err
	}
	if size >= shmThreshold {
		if seg := in.sharedMemory(); seg != nil {
			defer seg.Release()
			if slots := in.putPool.TryGet(putSlotsPerCall); len(slots) > 0 {
				return d.putShm(ctx, in, seg, slots, h, key, size, r, opts)
			}
		}
	}
	cctx, cancel := in.callCtx(ctx)
	defer cancel()
	policy := crashRetryable
	fail := func(err error) error { return d.p.convert(ctx, in, "write", err, policy) }

	stream, err := in.rpc.Put(cctx)
	if err != nil {
		return fail(err)
	}
	// sendErr returns the stream's real status: Send reports io.EOF when
	// the plugin ended the stream, and the cause comes with CloseAndRecv.
	sendErr := func(err error) error {
		if err == io.EOF {
			_, err = stream.CloseAndRecv()
			if err == nil {
				err = errors.New("plugin accepted the write before its commit frame")
			}
		}
		return fail(err)
	}
	hdr := &pb.PutHeader{Handle: h, Key: key, Size: size, IfNotExists: opts.IfNotExists, Crc32C: opts.CRC32C, ContentType: opts.ContentType}
	if err := stream.Send(&pb.PutFrame{Frame: &pb.PutFrame_Header{Header: hdr}}); err != nil {
		return sendErr(err)
	}
	body := bodyCheck{size: size, crc: crc32c.New()}
	buf := make([]byte, min(int64(wire.ChunkSize), max(size, 1)))
	abort := func(code backend.Code, err error) error {
		cancel() // ends the stream without a commit frame
		if ctx.Err() != nil {
			code, err = backend.CodeCanceled, fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
		return &CallError{Plugin: d.p.Name, Op: "write", Code: code, Err: err}
	}
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			policy = crashNotCommitted
			if err := body.add(buf[:n]); err != nil {
				return abort(backend.CodeSizeMismatch, err)
			}
			if err := stream.Send(&pb.PutFrame{Frame: &pb.PutFrame_Data{Data: &pb.PutData{Data: buf[:n]}}}); err != nil {
				return sendErr(err)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return abort(backend.CodeOf(rerr), fmt.Errorf("source: %w", rerr))
		}
	}
	if err := body.complete(); err != nil {
		return abort(backend.CodeSizeMismatch, err)
	}
	if err := ctx.Err(); err != nil {
		return abort(backend.CodeCanceled, err)
	}
	policy = crashAmbiguous
	if err := stream.Send(&pb.PutFrame{Frame: &pb.PutFrame_Commit{Commit: body.commit()}}); err != nil {
		return sendErr(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return fail(err)
	}
	return nil
}

// Stat implements backend.Driver.
func (d *driver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	var a backend.Attributes
	err := d.unary(ctx, "stat", func(cctx context.Context, in *instance, h string) error {
		resp, err := in.rpc.Stat(cctx, &pb.StatRequest{Handle: h, Key: key})
		if err != nil {
			return err
		}
		a = backend.Attributes{Size: resp.GetSize(), CRC32C: resp.Crc32C}
		if ns := resp.GetModTimeUnixNano(); ns != 0 {
			a.ModTime = time.Unix(0, ns)
		}
		return nil
	})
	return a, err
}

// Delete implements backend.Driver.
func (d *driver) Delete(ctx context.Context, key string) error {
	return d.unary(ctx, "delete", func(cctx context.Context, in *instance, h string) error {
		_, err := in.rpc.Delete(cctx, &pb.DeleteRequest{Handle: h, Key: key})
		return err
	})
}

// unary runs one idempotent call on a live instance.
func (d *driver) unary(ctx context.Context, op string, f func(context.Context, *instance, string) error) error {
	in, h, err := d.bind(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := in.callCtx(ctx)
	defer cancel()
	return d.p.convert(ctx, in, op, f(cctx, in, h), crashRetryable)
}

// List implements backend.Driver. An error from fn stops the stream and is
// returned as it is.
func (d *driver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.list(ctx, &pb.ListRequest{Prefix: prefix}, func(e *pb.ListEntry, _ bool) error {
		return fn(entryInfo(e))
	})
}

// ListDelimited implements backend.Driver with a delimited List request
// (protocol minor 2). A plugin that predates it ignores the field and
// streams the whole listing, with ListResponse.delimited unset: the host
// then groups the keys under prefix into common prefixes itself, relying on
// the ascending order of a plain listing to report each prefix once.
func (d *driver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	last := ""
	return d.list(ctx, &pb.ListRequest{Prefix: prefix, Delimited: true}, func(e *pb.ListEntry, delimited bool) error {
		if delimited {
			o := entryInfo(e)
			if e.GetIsPrefix() {
				o = backend.ObjectInfo{Key: e.GetKey(), IsPrefix: true}
			}
			return fn(o)
		}
		rest, ok := strings.CutPrefix(e.GetKey(), prefix)
		if !ok {
			return nil
		}
		i := strings.Index(rest, backend.Delimiter)
		if i < 0 {
			return fn(entryInfo(e))
		}
		p := prefix + rest[:i+1]
		if p == last {
			return nil
		}
		last = p
		return fn(backend.ObjectInfo{Key: p, IsPrefix: true})
	})
}

func entryInfo(e *pb.ListEntry) backend.ObjectInfo {
	o := backend.ObjectInfo{Key: e.GetKey(), Size: e.GetSize()}
	if ns := e.GetModTimeUnixNano(); ns != 0 {
		o.ModTime = time.Unix(0, ns)
	}
	return o
}

// list streams one List call, passing each entry with its response's
// delimited flag.
func (d *driver) list(ctx context.Context, req *pb.ListRequest, fn func(e *pb.ListEntry, delimited bool) error) error {
	in, h, err := d.bind(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := in.callCtx(ctx)
	defer cancel()
	req.Handle = h
	stream, err := in.rpc.List(cctx, req)
	if err != nil {
		return d.p.convert(ctx, in, "list", err, crashRetryable)
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return d.p.convert(ctx, in, "list", err, crashRetryable)
		}
		for _, e := range resp.GetEntries() {
			if err := fn(e, resp.GetDelimited()); err != nil {
				return err
			}
		}
	}
}

// Capabilities implements backend.Driver with what the plugin reported at
// the last Open.
func (d *driver) Capabilities() backend.Capabilities {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.caps
}

// ErrorCode implements backend.Driver.
func (d *driver) ErrorCode(err error) backend.Code {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return backend.CodeOf(err)
}

// Close implements backend.Driver: it releases the handle in the plugin,
// if the process that issued it still runs.
func (d *driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	gen, h := d.gen, d.handle
	d.mu.Unlock()
	in, _ := d.p.current()
	if in == nil || in.gen != gen {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cctx, ccancel := in.callCtx(ctx)
	defer ccancel()
	if _, err := in.rpc.Close(cctx, &pb.CloseRequest{Handle: h}); err != nil {
		return d.p.convert(ctx, in, "close", err, crashRetryable)
	}
	return nil
}

// bodyCheck counts and checksums a write's body as it is sent, for the
// commit frame, refusing a source that delivers other than size bytes.
type bodyCheck struct {
	size, count int64
	crc         hash.Hash32
}

// add accounts for b, failing if the source holds more than declared.
func (b *bodyCheck) add(p []byte) error {
	b.count += int64(len(p))
	if b.count > b.size {
		return fmt.Errorf("source holds more than the declared %d bytes: %w", b.size, backend.ErrSizeMismatch)
	}
	b.crc.Write(p)
	return nil
}

// complete fails if the source ended before the declared size.
func (b *bodyCheck) complete() error {
	if b.count != b.size {
		return fmt.Errorf("source delivered %d of the declared %d bytes: %w", b.count, b.size, backend.ErrSizeMismatch)
	}
	return nil
}

// commit is the commit frame for what was sent.
func (b *bodyCheck) commit() *pb.PutCommit {
	return &pb.PutCommit{Count: b.count, Crc32C: b.crc.Sum32()}
}

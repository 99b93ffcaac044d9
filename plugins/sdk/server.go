package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	hclog "github.com/hashicorp/go-hclog"
)

// listBatch is how many listing entries travel in one message.
const listBatch = 256

// errNoCommit: the host's write stream ended without its commit frame.
var errNoCommit = errors.New("write stream ended without a commit frame; nothing published")

// server implements the Storage service on top of Config.Open's drivers.
type server struct {
	pb.UnimplementedStorageServer
	cfg Config
	log hclog.Logger

	mu      sync.Mutex
	next    uint64
	drivers map[string]backend.Driver

	// seg is the shared segment the host passed, nil without one; readPool
	// hands out its read slots.
	seg      *shm.Segment
	readPool *shm.Pool
}

// readSlotsPerCall is how many read slots one ReadShm call uses at most:
// enough to fill some while the host copies others out.
const readSlotsPerCall = 4

func newServer(cfg Config, log hclog.Logger) *server {
	return &server{cfg: cfg, log: log, drivers: map[string]backend.Driver{}}
}

func (s *server) driver(handle string) (backend.Driver, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.drivers[handle]
	if !ok {
		return nil, wire.Errorf(backend.CodeUnknown, "plugin %s: unknown driver handle %q", s.cfg.Name, handle)
	}
	return d, nil
}

// fail classifies a driver error and turns it into a status for the host.
func fail(ctx context.Context, drv backend.Driver, err error) error {
	code := backend.CodeUnknown
	if drv != nil {
		code = drv.ErrorCode(err)
	}
	if code == backend.CodeUnknown {
		code = backend.CodeOf(err)
	}
	if ctx.Err() != nil && code == backend.CodeUnknown {
		code = backend.CodeCanceled
	}
	return wire.ToStatus(code, err)
}

func checkKey(key string) error {
	if err := backend.ValidateKey(key); err != nil {
		return wire.ToStatus(backend.CodeInvalidKey, err)
	}
	return nil
}

// Describe implements pb.StorageServer. It accepts the shared-memory path
// when the host offers it and the segment was mapped.
func (s *server) Describe(_ context.Context, req *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	resp := &pb.DescribeResponse{
		Name:          s.cfg.Name,
		Version:       s.cfg.Version,
		Schemes:       slices.Clone(s.cfg.Schemes),
		ProtocolMinor: wire.ProtocolMinor,
	}
	if s.seg != nil && slices.Contains(req.GetHostFeatures(), wire.FeatureSharedMemory) {
		resp.Features = append(resp.Features, wire.FeatureSharedMemory)
	}
	return resp, nil
}

// Open implements pb.StorageServer.
func (s *server) Open(ctx context.Context, req *pb.OpenRequest) (*pb.OpenResponse, error) {
	u, err := url.Parse(req.GetUrl())
	if err != nil {
		return nil, wire.Errorf(backend.CodeUnknown, "plugin %s: URL does not parse", s.cfg.Name)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if !slices.Contains(s.cfg.Schemes, u.Scheme) {
		return nil, wire.Errorf(backend.CodeUnsupported, "plugin %s does not serve scheme %q", s.cfg.Name, u.Scheme)
	}
	drv, prefix, err := s.cfg.Open(ctx, u)
	if err != nil {
		return nil, fail(ctx, nil, fmt.Errorf("plugin %s: open: %w", s.cfg.Name, err))
	}
	s.mu.Lock()
	s.next++
	h := strconv.FormatUint(s.next, 10)
	s.drivers[h] = drv
	s.mu.Unlock()
	return &pb.OpenResponse{Handle: h, Prefix: prefix, Capabilities: capsToPB(drv.Capabilities())}, nil
}

// Close implements pb.StorageServer.
func (s *server) Close(ctx context.Context, req *pb.CloseRequest) (*pb.CloseResponse, error) {
	s.mu.Lock()
	drv, ok := s.drivers[req.GetHandle()]
	delete(s.drivers, req.GetHandle())
	s.mu.Unlock()
	if !ok {
		return &pb.CloseResponse{}, nil
	}
	if err := drv.Close(); err != nil {
		return nil, fail(ctx, drv, err)
	}
	return &pb.CloseResponse{}, nil
}

// Capabilities implements pb.StorageServer.
func (s *server) Capabilities(_ context.Context, req *pb.CapabilitiesRequest) (*pb.CapabilitiesResponse, error) {
	drv, err := s.driver(req.GetHandle())
	if err != nil {
		return nil, err
	}
	return &pb.CapabilitiesResponse{Capabilities: capsToPB(drv.Capabilities())}, nil
}

func capsToPB(c backend.Capabilities) *pb.Caps {
	return &pb.Caps{
		CreateIfAbsent: c.CreateIfAbsent,
		ServerCrc32C:   c.ServerCRC32C,
		Multipart:      c.Multipart,
		PartSize:       c.PartSize,
		Concurrency:    int32(c.Concurrency),
	}
}

// Read implements pb.StorageServer. The first message goes out once the
// driver opened the range, so open errors (not-found) reach the host before
// any data.
func (s *server) Read(req *pb.ReadRequest, stream pb.Storage_ReadServer) error {
	ctx := stream.Context()
	drv, rc, err := s.openRange(ctx, req)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := stream.Send(&pb.ReadChunk{}); err != nil {
		return err
	}
	return streamRange(ctx, drv, rc, stream.Send)
}

// openRange validates a read request and opens the range.
func (s *server) openRange(ctx context.Context, req *pb.ReadRequest) (backend.Driver, io.ReadCloser, error) {
	drv, err := s.driver(req.GetHandle())
	if err != nil {
		return nil, nil, err
	}
	if err := checkKey(req.GetKey()); err != nil {
		return nil, nil, err
	}
	if req.GetOffset() < 0 {
		return nil, nil, wire.Errorf(backend.CodeInvalidKey, "negative offset %d", req.GetOffset())
	}
	rc, err := drv.NewRangeReader(ctx, req.GetKey(), req.GetOffset(), req.GetLength())
	if err != nil {
		return nil, nil, fail(ctx, drv, err)
	}
	return drv, rc, nil
}

// streamRange sends rc's bytes inline, in ChunkSize messages.
func streamRange(ctx context.Context, drv backend.Driver, rc io.Reader, send func(*pb.ReadChunk) error) error {
	buf := make([]byte, wire.ChunkSize)
	for {
		n, err := io.ReadFull(rc, buf)
		if n > 0 {
			// Send marshals before returning, so buf can be reused.
			if serr := send(&pb.ReadChunk{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil
		case err != nil:
			return fail(ctx, drv, err)
		}
	}
}

// ReadShm implements pb.StorageServer: Read through read slots of the
// shared segment, or inline when it has none (no segment, all slots busy).
//
// A slot named to the host is written again only after the host
// acknowledged it, and the call returns (releasing its slots to other
// calls) only once every slot it named was acknowledged or the host ended
// the call: the host copies a slot out only while its call is live, so no
// slot is ever rewritten under the host's copy.
func (s *server) ReadShm(stream pb.Storage_ReadShmServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return wire.ToStatus(backend.CodeUnknown, fmt.Errorf("read stream: no request: %w", err))
	}
	req := first.GetOpen()
	if req == nil {
		return wire.Errorf(backend.CodeUnknown, "read stream: first message is not a request")
	}
	drv, rc, err := s.openRange(ctx, req)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := stream.Send(&pb.ReadChunk{}); err != nil {
		return err
	}
	var slots []uint32
	if s.seg != nil {
		slots = s.readPool.TryGet(readSlotsPerCall)
	}
	if len(slots) == 0 {
		return streamRange(ctx, drv, rc, stream.Send)
	}
	defer s.readPool.Put(slots...)
	free := slices.Clone(slots)
	outstanding := map[uint32]bool{}
	awaitAck := func() error {
		m, err := stream.Recv()
		if err != nil {
			// The host ended the call: it copies nothing out any more.
			return wire.ToStatus(backend.CodeCanceled, fmt.Errorf("read stream ended by the host: %w", err))
		}
		ack := m.GetAck()
		if ack == nil || !outstanding[ack.GetSlot()] {
			return wire.Errorf(backend.CodeUnknown, "read stream: unexpected message from the host")
		}
		delete(outstanding, ack.GetSlot())
		free = append(free, ack.GetSlot())
		return nil
	}
	drain := func(result error) error {
		for len(outstanding) > 0 {
			if err := awaitAck(); err != nil {
				if result != nil {
					return result
				}
				return err
			}
		}
		return result
	}
	for {
		if len(free) == 0 {
			if err := awaitAck(); err != nil {
				return err
			}
		}
		i := free[len(free)-1]
		free = free[:len(free)-1]
		buf, err := s.seg.ReadSlot(i)
		if err != nil {
			return drain(wire.ToStatus(backend.CodeUnknown, err))
		}
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 {
			outstanding[i] = true
			if err := stream.Send(&pb.ReadChunk{Shm: &pb.ShmRef{Slot: i, Length: uint32(n)}}); err != nil {
				return err // the call is over: the host copies nothing out
			}
		} else {
			free = append(free, i)
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return drain(nil)
		case rerr != nil:
			return drain(fail(ctx, drv, rerr))
		}
	}
}

// Put implements pb.StorageServer; see putBody for the commit rule.
func (s *server) Put(stream pb.Storage_PutServer) error {
	if err := s.put(stream.Context(), stream.Recv, nil); err != nil {
		return err
	}
	return stream.SendAndClose(&pb.PutResponse{})
}

// PutShm implements pb.StorageServer: Put whose data frames may name put
// slots of the shared segment. Each slot is acknowledged once the driver
// consumed its bytes; success is an OK status.
func (s *server) PutShm(stream pb.Storage_PutShmServer) error {
	var mu sync.Mutex
	ack := func(slot uint32) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(&pb.PutShmReply{Ack: &pb.ShmRef{Slot: slot}})
	}
	return s.put(stream.Context(), stream.Recv, ack)
}

// put runs one write stream into the driver. ack is nil on the plain Put
// stream, where shared-memory frames are refused.
func (s *server) put(ctx context.Context, recv func() (*pb.PutFrame, error), ack func(uint32) error) error {
	first, err := recv()
	if err != nil {
		return wire.ToStatus(backend.CodeUnknown, fmt.Errorf("write stream: no header: %w", err))
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return wire.Errorf(backend.CodeUnknown, "write stream: first frame is not a header")
	}
	drv, err := s.driver(hdr.GetHandle())
	if err != nil {
		return err
	}
	if err := checkKey(hdr.GetKey()); err != nil {
		return err
	}
	if hdr.GetSize() < 0 {
		return wire.Errorf(backend.CodeSizeMismatch, "negative size %d", hdr.GetSize())
	}
	body := &putBody{recvFrame: recv, ctx: ctx, size: hdr.GetSize(), want: hdr.Crc32C, crc: crc32c.New(), held: -1}
	if ack != nil {
		body.seg, body.ack = s.seg, ack
	}
	if body.size == 0 {
		// No byte to hold back: the commit must arrive before the driver runs.
		body.awaitCommit()
		if body.err != nil {
			s.log.Warn("write aborted; nothing published", "key", hdr.GetKey(), "body_error", body.err.Error())
			return fail(ctx, nil, body.err)
		}
	}
	opts := backend.PutOptions{IfNotExists: hdr.GetIfNotExists(), CRC32C: hdr.Crc32C, ContentType: hdr.GetContentType()}
	err = drv.Put(ctx, hdr.GetKey(), hdr.GetSize(), body, opts)
	if err != nil || body.err != nil {
		s.log.Warn("write aborted; nothing published", "key", hdr.GetKey(), "body_error", errString(body.err), "driver_error", errString(err))
	}
	switch {
	case err != nil && body.err != nil:
		// The body's failure is the cause; classify it, not the driver's echo.
		return fail(ctx, nil, fmt.Errorf("%w (driver: %v)", body.err, err))
	case err != nil:
		return fail(ctx, drv, err)
	case body.err != nil:
		return wire.Errorf(backend.CodeUnknown, "plugin %s: driver published %q despite a failed body: %v", s.cfg.Name, hdr.GetKey(), body.err)
	case !body.committed:
		return wire.Errorf(backend.CodeUnknown, "plugin %s: driver returned from Put of %q before reading the whole body", s.cfg.Name, hdr.GetKey())
	}
	return nil
}

// putBody is the io.Reader a driver's Put consumes. It delivers the data
// frames but holds back the frame that completes the declared size until
// the commit frame has arrived and matched the byte count and CRC32C of
// everything received. Only then does it hand over the last bytes and, on
// the next call, io.EOF. Any other course (the stream ends or is
// cancelled, a frame overruns the size, the commit disagrees) makes every
// Read fail, so a driver that publishes only after a clean read of exactly
// size bytes never publishes a truncated or corrupted object.
//
// On PutShm a data frame may name a put slot instead. The driver reads
// such bytes straight from the slot, which is acknowledged once drained;
// the frame completing the size is first copied out of its slot (and the
// slot acknowledged), so that the bytes checked against the commit frame
// are the bytes handed over, whatever happens to the slot afterwards.
type putBody struct {
	recvFrame func() (*pb.PutFrame, error)
	ctx       context.Context
	size      int64
	want      *uint32 // CRC32C announced in the header, if any
	crc       hashWriter
	got       int64
	pending   []byte
	held      int64 // put slot pending points into, -1 for none
	committed bool
	err       error

	seg *shm.Segment       // nil: shared-memory frames are refused
	ack func(uint32) error // releases a put slot to the host
}

type hashWriter interface {
	Write([]byte) (int, error)
	Sum32() uint32
}

// Read implements io.Reader.
func (b *putBody) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.release()
		if b.err != nil {
			return 0, b.err
		}
		if b.committed {
			return 0, io.EOF
		}
		b.next()
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// release acknowledges the put slot the drained pending bytes came from.
func (b *putBody) release() {
	if b.held < 0 {
		return
	}
	slot := uint32(b.held)
	b.held = -1
	if err := b.ack(slot); err != nil {
		b.err = fmt.Errorf("write stream after %d of %d bytes: acknowledging a slot: %w", b.got, b.size, err)
	}
}

// recv receives one frame, turning stream failures into b.err.
func (b *putBody) recv() *pb.PutFrame {
	f, err := b.recvFrame()
	switch {
	case err == nil:
		return f
	case b.ctx.Err() != nil:
		b.err = fmt.Errorf("write cancelled after %d of %d bytes: %w", b.got, b.size, context.Cause(b.ctx))
	case err == io.EOF:
		b.err = fmt.Errorf("after %d of %d bytes: %w", b.got, b.size, errNoCommit)
	default:
		b.err = fmt.Errorf("write stream after %d of %d bytes: %w", b.got, b.size, err)
	}
	return nil
}

// slotBytes resolves a shared-memory data frame, bounds-checked.
func (b *putBody) slotBytes(ref *pb.ShmRef) []byte {
	if b.seg == nil {
		b.err = errors.New("write stream: shared-memory frame on a stream without a segment")
		return nil
	}
	d, err := b.seg.PutRef(ref.GetSlot(), ref.GetLength())
	if err != nil {
		b.err = fmt.Errorf("write stream: %w", err)
		return nil
	}
	return d
}

// next receives the next data frame into pending, or fails.
func (b *putBody) next() {
	f := b.recv()
	if f == nil {
		return
	}
	var d []byte
	held := int64(-1)
	switch fr := f.GetFrame().(type) {
	case *pb.PutFrame_Data:
		d = fr.Data.GetData()
		if len(d) > wire.MaxFrameSize {
			b.err = fmt.Errorf("data frame of %d bytes exceeds the %d-byte limit", len(d), wire.MaxFrameSize)
			return
		}
	case *pb.PutFrame_ShmData:
		if d = b.slotBytes(fr.ShmData); d == nil {
			return
		}
		held = int64(fr.ShmData.GetSlot())
	case *pb.PutFrame_Commit:
		b.err = fmt.Errorf("commit frame after %d of the declared %d bytes: %w", b.got, b.size, backend.ErrSizeMismatch)
		return
	default:
		b.err = errors.New("write stream: unexpected frame")
		return
	}
	if b.got+int64(len(d)) > b.size {
		b.err = fmt.Errorf("write stream holds more than the declared %d bytes: %w", b.size, backend.ErrSizeMismatch)
		return
	}
	if held >= 0 && b.got+int64(len(d)) == b.size {
		// The last bytes: check and hand over a private copy.
		d = bytes.Clone(d)
		if err := b.ack(uint32(held)); err != nil {
			b.err = fmt.Errorf("write stream after %d of %d bytes: acknowledging a slot: %w", b.got, b.size, err)
			return
		}
		held = -1
	}
	b.crc.Write(d)
	b.got += int64(len(d))
	b.held = held
	if b.got == b.size {
		b.awaitCommit()
		if b.err != nil {
			return
		}
	}
	b.pending = d
}

// awaitCommit receives frames after the last data byte until the commit
// frame, and verifies it.
func (b *putBody) awaitCommit() {
	for {
		f := b.recv()
		if f == nil {
			return
		}
		switch fr := f.GetFrame().(type) {
		case *pb.PutFrame_Data:
			if len(fr.Data.GetData()) > 0 {
				b.err = fmt.Errorf("write stream holds more than the declared %d bytes: %w", b.size, backend.ErrSizeMismatch)
				return
			}
		case *pb.PutFrame_ShmData:
			if fr.ShmData.GetLength() > 0 {
				b.err = fmt.Errorf("write stream holds more than the declared %d bytes: %w", b.size, backend.ErrSizeMismatch)
				return
			}
			b.err = errors.New("write stream: empty shared-memory frame")
			return
		case *pb.PutFrame_Commit:
			sum := b.crc.Sum32()
			switch c := fr.Commit; {
			case c.GetCount() != b.got:
				b.err = fmt.Errorf("commit frame counts %d bytes, received %d: %w", c.GetCount(), b.got, backend.ErrSizeMismatch)
			case c.GetCrc32C() != sum:
				b.err = fmt.Errorf("commit frame CRC32C %08x, received data %08x: data corrupted in transit", c.GetCrc32C(), sum)
			case b.want != nil && *b.want != sum:
				b.err = fmt.Errorf("header CRC32C %08x, received data %08x: body does not match its checksum", *b.want, sum)
			default:
				b.committed = true
			}
			return
		default:
			b.err = errors.New("write stream: unexpected frame before commit")
			return
		}
	}
}

// Stat implements pb.StorageServer.
func (s *server) Stat(ctx context.Context, req *pb.StatRequest) (*pb.StatResponse, error) {
	drv, err := s.driver(req.GetHandle())
	if err != nil {
		return nil, err
	}
	if err := checkKey(req.GetKey()); err != nil {
		return nil, err
	}
	a, err := drv.Stat(ctx, req.GetKey())
	if err != nil {
		return nil, fail(ctx, drv, err)
	}
	resp := &pb.StatResponse{Size: a.Size, Crc32C: a.CRC32C}
	if !a.ModTime.IsZero() {
		resp.ModTimeUnixNano = a.ModTime.UnixNano()
	}
	return resp, nil
}

// List implements pb.StorageServer, in batches of listBatch entries; a
// delimited request is served by the driver's ListDelimited, and each
// response says so.
func (s *server) List(req *pb.ListRequest, stream pb.Storage_ListServer) error {
	ctx := stream.Context()
	drv, err := s.driver(req.GetHandle())
	if err != nil {
		return err
	}
	if p := strings.TrimSuffix(req.GetPrefix(), "/"); p != "" {
		if err := checkKey(p); err != nil {
			return err
		}
	}
	list, delimited := drv.List, req.GetDelimited()
	if delimited {
		if p := req.GetPrefix(); p != "" && !strings.HasSuffix(p, backend.Delimiter) {
			return fail(ctx, drv, fmt.Errorf("delimited listing prefix %q does not end in %q: %w", p, backend.Delimiter, backend.ErrInvalidKey))
		}
		list = drv.ListDelimited
	}
	batch := &pb.ListResponse{Delimited: delimited}
	var sendErr error
	flush := func() error {
		if len(batch.Entries) == 0 {
			return nil
		}
		err := stream.Send(batch)
		batch = &pb.ListResponse{Delimited: delimited}
		return err
	}
	err = list(ctx, req.GetPrefix(), func(o backend.ObjectInfo) error {
		e := &pb.ListEntry{Key: o.Key, Size: o.Size, IsPrefix: o.IsPrefix}
		if !o.ModTime.IsZero() {
			e.ModTimeUnixNano = o.ModTime.UnixNano()
		}
		batch.Entries = append(batch.Entries, e)
		if len(batch.Entries) >= listBatch {
			sendErr = flush()
			return sendErr
		}
		return nil
	})
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return fail(ctx, drv, err)
	}
	return flush()
}

// Delete implements pb.StorageServer.
func (s *server) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	drv, err := s.driver(req.GetHandle())
	if err != nil {
		return nil, err
	}
	if err := checkKey(req.GetKey()); err != nil {
		return nil, err
	}
	if err := drv.Delete(ctx, req.GetKey()); err != nil {
		if c := drv.ErrorCode(err); c == backend.CodeNotFound || (c == backend.CodeUnknown && errors.Is(err, backend.ErrNotFound)) {
			return &pb.DeleteResponse{}, nil
		}
		return nil, fail(ctx, drv, err)
	}
	return &pb.DeleteResponse{}, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

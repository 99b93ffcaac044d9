// Package shm is the shared-memory segment of the plugin bulk-data path.
//
// The host creates one segment per plugin process, before starting it, and
// hands it to the process as an inherited file descriptor (on Linux an
// anonymous, sealed memfd: it has no name in any file system, so only the
// host and its plugin can map it). The segment is cut into fixed-size
// slots: put slots, which only the host writes (write bodies), followed by
// read slots, which only the plugin writes (read ranges). Which bytes are
// ready, and when a slot may be reused, travels over the gRPC stream of
// the call; this package only maps the memory and bounds-checks every slot
// reference, so that a peer can never make the other side touch memory
// outside the segment.
package shm

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// ErrNoSharedMemory is returned where shared memory is not available (systems
// other than Linux).
var ErrNoSharedMemory = ckpterr.New(ckpterr.Unsupported, "shared-memory bulk path not supported on this system")

// ErrBadRef is wrapped by errors of slot references outside the segment.
var ErrBadRef = ckpterr.New(ckpterr.Internal, "slot reference outside the shared segment")

// Limits on a Layout, so that a malformed description cannot ask for an
// absurd mapping.
const (
	MinSlotSize = 64 << 10
	MaxSlotSize = 64 << 20
	MaxSlots    = 256
)

// Layout describes a segment: PutSlots slots of SlotSize bytes, then
// ReadSlots more.
type Layout struct {
	SlotSize  int
	PutSlots  int
	ReadSlots int
}

// Size is the segment's size in bytes.
func (l Layout) Size() int { return l.SlotSize * (l.PutSlots + l.ReadSlots) }

// Validate checks l against the package limits.
func (l Layout) Validate() error {
	switch {
	case l.SlotSize < MinSlotSize || l.SlotSize > MaxSlotSize:
		return fmt.Errorf("shm: slot size %d outside [%d, %d]", l.SlotSize, MinSlotSize, MaxSlotSize)
	case l.PutSlots < 1 || l.ReadSlots < 1 || l.PutSlots+l.ReadSlots > MaxSlots:
		return fmt.Errorf("shm: %d put and %d read slots: want 1 or more of each, %d in all at most", l.PutSlots, l.ReadSlots, MaxSlots)
	}
	return nil
}

// Env encodes l and the descriptor number the plugin finds the segment at,
// for the plugin's environment.
func (l Layout) Env(fd int) string {
	return fmt.Sprintf("fd=%d,slot=%d,put=%d,read=%d", fd, l.SlotSize, l.PutSlots, l.ReadSlots)
}

// ParseEnv decodes what Env encoded and validates the layout.
func ParseEnv(s string) (Layout, int, error) {
	var l Layout
	fd := -1
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return Layout{}, 0, fmt.Errorf("shm: malformed segment description %q", s)
		}
		switch k {
		case "fd":
			fd = n
		case "slot":
			l.SlotSize = n
		case "put":
			l.PutSlots = n
		case "read":
			l.ReadSlots = n
		default:
			return Layout{}, 0, fmt.Errorf("shm: unknown key %q in segment description", k)
		}
	}
	if fd < 0 {
		return Layout{}, 0, fmt.Errorf("shm: segment description %q names no descriptor", s)
	}
	return l, fd, l.Validate()
}

// Segment is a mapped segment. Its memory stays mapped while references
// taken with Acquire are held, so Close never unmaps it under a copy.
type Segment struct {
	layout Layout
	mem    []byte

	mu      sync.Mutex
	refs    int
	closing bool
}

// Layout returns the segment's layout.
func (s *Segment) Layout() Layout { return s.layout }

// PutSlot returns the whole of put slot i.
func (s *Segment) PutSlot(i uint32) ([]byte, error) {
	if uint64(i) >= uint64(s.layout.PutSlots) {
		return nil, fmt.Errorf("put slot %d of %d: %w", i, s.layout.PutSlots, ErrBadRef)
	}
	off := int(i) * s.layout.SlotSize
	return s.mem[off : off+s.layout.SlotSize : off+s.layout.SlotSize], nil
}

// ReadSlot returns the whole of read slot i.
func (s *Segment) ReadSlot(i uint32) ([]byte, error) {
	if uint64(i) >= uint64(s.layout.ReadSlots) {
		return nil, fmt.Errorf("read slot %d of %d: %w", i, s.layout.ReadSlots, ErrBadRef)
	}
	off := (s.layout.PutSlots + int(i)) * s.layout.SlotSize
	return s.mem[off : off+s.layout.SlotSize : off+s.layout.SlotSize], nil
}

// PutRef returns the first n bytes of put slot i, checking both bounds.
func (s *Segment) PutRef(i, n uint32) ([]byte, error) {
	b, err := s.PutSlot(i)
	return prefix(b, i, n, err)
}

// ReadRef returns the first n bytes of read slot i, checking both bounds.
func (s *Segment) ReadRef(i, n uint32) ([]byte, error) {
	b, err := s.ReadSlot(i)
	return prefix(b, i, n, err)
}

func prefix(b []byte, i, n uint32, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	if uint64(n) > uint64(len(b)) {
		return nil, fmt.Errorf("%d bytes in slot %d of %d bytes: %w", n, i, len(b), ErrBadRef)
	}
	return b[:n:n], nil
}

// Acquire takes a reference that keeps the memory mapped; it fails once
// Close was called.
func (s *Segment) Acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.refs++
	return true
}

// Release drops a reference taken with Acquire.
func (s *Segment) Release() {
	s.mu.Lock()
	s.refs--
	last := s.closing && s.refs == 0
	s.mu.Unlock()
	if last {
		s.unmap()
	}
}

// Close unmaps the segment once the last reference is released. It is
// idempotent.
func (s *Segment) Close() {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	last := !already && s.refs == 0
	s.mu.Unlock()
	if last {
		s.unmap()
	}
}

// Pool hands out slot numbers. It never blocks: a caller that finds no free
// slot falls back to sending bytes inline.
type Pool struct{ free chan uint32 }

// NewPool returns a pool of slots 0..n-1.
func NewPool(n int) *Pool {
	p := &Pool{free: make(chan uint32, n)}
	for i := 0; i < n; i++ {
		p.free <- uint32(i)
	}
	return p
}

// TryGet takes up to n free slots, possibly none.
func (p *Pool) TryGet(n int) []uint32 {
	var got []uint32
	for len(got) < n {
		select {
		case i := <-p.free:
			got = append(got, i)
		default:
			return got
		}
	}
	return got
}

// Put returns slots to the pool.
func (p *Pool) Put(slots ...uint32) {
	for _, i := range slots {
		p.free <- i
	}
}

// Free returns how many slots are free now.
func (p *Pool) Free() int { return len(p.free) }

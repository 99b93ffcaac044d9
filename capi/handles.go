package main

import (
	"fmt"
	"sync"
)

// handleTable is the table of the handles the C ABI hands out: a handle is
// an index into the table and the generation of the slot, so a closed,
// stale (its slot reused), zero or random handle is recognised and refused
// with a usage error instead of reaching freed memory (runtime/cgo.Handle
// panics on those). A call holds a reference on its handle for its whole
// duration (acquire/release); closing a handle (remove) refuses new calls at
// once and waits for the calls in flight to release theirs before the value
// is handed back to be freed, so nothing is freed under a running call.
type handleTable struct {
	mu    sync.Mutex
	slots []handleSlot
	free  []uint32
}

// handleSlot is one entry: the value, its generation (bumped when the slot
// is freed), the calls in flight and whether it is being closed.
type handleSlot struct {
	gen     uint32
	v       any
	refs    int
	closing bool
	// drained is closed when the last call in flight of a closing handle
	// releases its reference.
	drained chan struct{}
}

// handles is the process's table.
var handles handleTable

// handleID packs a slot index (from 1, so no handle is 0) and generation.
func handleID(idx, gen uint32) uint64 { return uint64(gen)<<32 | uint64(idx+1) }

// add registers v and returns its handle.
func (t *handleTable) add(v any) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		idx = uint32(len(t.slots))
		// Generations start at 1: the id is never a small integer such as
		// a count or a file descriptor passed by mistake.
		t.slots = append(t.slots, handleSlot{gen: 1})
	}
	s := &t.slots[idx]
	s.v, s.refs, s.closing, s.drained = v, 0, false, nil
	return handleID(idx, s.gen)
}

// lookup returns h's slot, or a usage error naming what was expected.
// t.mu is held.
func (t *handleTable) lookup(h uint64, what string) (*handleSlot, error) {
	if h == 0 {
		return nil, fmt.Errorf("%w: %s handle is 0 (closed or never opened)", errUsage, what)
	}
	idx, gen := uint32(h&0xffffffff)-1, uint32(h>>32)
	if uint64(idx) >= uint64(len(t.slots)) || t.slots[idx].gen != gen || t.slots[idx].v == nil {
		return nil, fmt.Errorf("%w: %s handle %#x is closed or was never opened", errUsage, what, h)
	}
	s := &t.slots[idx]
	if s.closing {
		return nil, fmt.Errorf("%w: %s handle %#x is closed", errUsage, what, h)
	}
	return s, nil
}

// acquire returns what h refers to, when it is a T, and takes a reference
// the caller gives back with release once its call is over.
func acquire[T any](t *handleTable, h uint64, what string) (T, func(), error) {
	var zero T
	t.mu.Lock()
	defer t.mu.Unlock()
	s, err := t.lookup(h, what)
	if err != nil {
		return zero, nil, err
	}
	v, ok := s.v.(T)
	if !ok {
		return zero, nil, fmt.Errorf("%w: handle %#x is not a %s", errUsage, h, what)
	}
	s.refs++
	var once sync.Once
	return v, func() { once.Do(func() { t.release(h) }) }, nil
}

// release gives back a reference acquire took.
func (t *handleTable) release(h uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &t.slots[uint32(h&0xffffffff)-1]
	s.refs--
	if s.refs == 0 && s.closing {
		close(s.drained)
	}
}

// remove closes h when it refers to a T: new calls on it fail from now on,
// remove waits until the calls in flight have released it, frees the slot
// (a later handle in it has another generation) and returns the value for
// the caller to release.
func remove[T any](t *handleTable, h uint64, what string) (T, error) {
	var zero T
	t.mu.Lock()
	s, err := t.lookup(h, what)
	if err != nil {
		t.mu.Unlock()
		return zero, err
	}
	v, ok := s.v.(T)
	if !ok {
		t.mu.Unlock()
		return zero, fmt.Errorf("%w: handle %#x is not a %s", errUsage, h, what)
	}
	s.closing = true
	var drained chan struct{}
	if s.refs > 0 {
		s.drained = make(chan struct{})
		drained = s.drained
	}
	t.mu.Unlock()
	if drained != nil {
		<-drained
	}
	t.mu.Lock()
	idx := uint32(h&0xffffffff) - 1
	s = &t.slots[idx] // the slice may have grown meanwhile
	s.v, s.drained, s.closing = nil, nil, false
	s.gen++
	if s.gen == 0 {
		s.gen = 1
	}
	t.free = append(t.free, idx)
	t.mu.Unlock()
	return v, nil
}

// live is the number of handles open (tests).
func (t *handleTable) live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.slots) - len(t.free)
}

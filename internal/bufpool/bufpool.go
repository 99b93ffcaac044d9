// Package bufpool is ckptkit's one pool of reusable byte buffers: the fs
// driver's copy buffers, the S3 driver's multipart part buffers and the
// loader's read buffers all come from it.
//
// A Pool holds buffers of one size. An unbounded pool (New) never blocks
// and lets the garbage collector reclaim idle buffers; a bounded pool
// (NewBounded) has at most n buffers out at once, so Get blocks until one
// comes back: that is how a multipart upload caps its memory at
// n * part size.
//
// Map (Mapped) is memory for a long-lived pool of large buffers taken
// from the operating system outside the Go heap, with huge pages where
// Linux allows them: the async saver's staging pool.
package bufpool

import (
	"context"
	"sync"
)

// Pool hands out buffers of Size bytes. It is safe for concurrent use.
type Pool struct {
	size int
	idle sync.Pool // unbounded: *[]byte of cap size

	free  chan []byte   // bounded: idle buffers
	slots chan struct{} // bounded: one token per buffer that may still be made
}

// New returns an unbounded pool of size-byte buffers.
func New(size int) *Pool { return &Pool{size: size} }

// NewBounded returns a pool with at most n buffers of size bytes out at
// once (made on demand): Get blocks while n are out.
func NewBounded(size, n int) *Pool {
	p := &Pool{size: size, free: make(chan []byte, n), slots: make(chan struct{}, n)}
	for range n {
		p.slots <- struct{}{}
	}
	return p
}

// Size returns the pool's buffer size.
func (p *Pool) Size() int { return p.size }

// Get returns a buffer of length n (n <= Size; its capacity is Size). A
// bounded pool waits while all its buffers are out, until one is Put back
// or Forgotten or ctx ends (then it returns ctx's error). A request larger
// than Size gets a buffer of its own, outside the pool and its bound.
func (p *Pool) Get(ctx context.Context, n int) ([]byte, error) {
	if n > p.size {
		return make([]byte, n), nil
	}
	if p.slots == nil {
		if b, ok := p.idle.Get().(*[]byte); ok {
			return (*b)[:n], nil
		}
		return make([]byte, n, p.size), nil
	}
	select {
	case b := <-p.free:
		return b[:n], nil
	default:
	}
	select {
	case b := <-p.free:
		return b[:n], nil
	case <-p.slots:
		return make([]byte, n, p.size), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Put returns b, which Get handed out, for reuse. Buffers of another
// capacity (the oversized ones) are dropped.
func (p *Pool) Put(b []byte) {
	if cap(b) != p.size {
		return
	}
	b = b[:p.size]
	if p.slots == nil {
		p.idle.Put(&b)
		return
	}
	select {
	case p.free <- b:
	default: // cannot happen: at most n buffers exist
	}
}

// Forget tells a bounded pool that a buffer Get handed out will not come
// back (something may still hold it, such as an HTTP transport after a
// failed request), so that another may be made in its place. An unbounded
// pool ignores it.
func (p *Pool) Forget() {
	if p.slots == nil {
		return
	}
	select {
	case p.slots <- struct{}{}:
	default:
	}
}

// Package instrument wraps a backend.Driver to count what reaches it: calls
// per operation and per key, and bytes read and written. Tests use it to
// assert how much I/O a code path does, for example
//
//	c := instrument.Wrap(store.Driver())
//	store = store.WithDriver(c)
//	... // exercise store
//	c.Count(instrument.OpRead)
package instrument

import (
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ckptkit/ckptkit/backend"
)

// Operation names accepted by Count, CountKey and CountKeySuffix.
const (
	OpRead = "read" // NewRangeReader
	OpPut  = "put"  // Put
	OpStat = "stat" // Stat
	OpList = "list" // List; the key is the listed prefix
	// OpListDelimited is ListDelimited; the key is the listed prefix.
	OpListDelimited = "list-delimited"
	OpDelete        = "delete" // Delete
)

type opKey struct{ op, key string }

// Counter is a backend.Driver that forwards to another driver and counts
// every call. Calls are counted whether or not they succeed. It is safe for
// concurrent use.
type Counter struct {
	d backend.Driver

	mu      sync.Mutex
	ops     map[string]int64
	keys    map[opKey]int64
	read    atomic.Int64
	written atomic.Int64
	listed  atomic.Int64
}

var _ backend.Driver = (*Counter)(nil)

// Wrap returns a Counter forwarding to d.
func Wrap(d backend.Driver) *Counter {
	return &Counter{d: d, ops: map[string]int64{}, keys: map[opKey]int64{}}
}

// Unwrap returns the wrapped driver.
func (c *Counter) Unwrap() backend.Driver { return c.d }

func (c *Counter) note(op, key string) {
	c.mu.Lock()
	c.ops[op]++
	c.keys[opKey{op, key}]++
	c.mu.Unlock()
}

// Count returns how many times op was called.
func (c *Counter) Count(op string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

// Total returns the number of calls of all operations.
func (c *Counter) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.ops {
		n += v
	}
	return n
}

// CountKey returns how many times op was called on key, the full key the
// driver saw (including any Store prefix).
func (c *Counter) CountKey(op, key string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[opKey{op, key}]
}

// CountKeySuffix returns how many times op was called on keys ending with
// suffix, which is handy when the Store prefix is not known.
func (c *Counter) CountKeySuffix(op, suffix string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for k, v := range c.keys {
		if k.op == op && strings.HasSuffix(k.key, suffix) {
			n += v
		}
	}
	return n
}

// Listed returns how many entries List and ListDelimited delivered
// (objects and common prefixes): what a listing enumerated.
func (c *Counter) Listed() int64 { return c.listed.Load() }

// BytesRead returns the bytes delivered by readers opened through c.
func (c *Counter) BytesRead() int64 { return c.read.Load() }

// BytesWritten returns the bytes Put calls consumed from their sources
// (including those of writes that then failed).
func (c *Counter) BytesWritten() int64 { return c.written.Load() }

// Reset zeroes every counter.
func (c *Counter) Reset() {
	c.mu.Lock()
	c.ops = map[string]int64{}
	c.keys = map[opKey]int64{}
	c.mu.Unlock()
	c.read.Store(0)
	c.written.Store(0)
	c.listed.Store(0)
}

// NewRangeReader implements backend.Driver, counted as OpRead.
func (c *Counter) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	c.note(OpRead, key)
	rc, err := c.d.NewRangeReader(ctx, key, offset, length)
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: rc, n: &c.read}, nil
}

// Put implements backend.Driver, counted as OpPut.
func (c *Counter) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	c.note(OpPut, key)
	return c.d.Put(ctx, key, size, &countingSource{r: r, n: &c.written}, opts)
}

// Stat implements backend.Driver, counted as OpStat.
func (c *Counter) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	c.note(OpStat, key)
	return c.d.Stat(ctx, key)
}

// List implements backend.Driver, counted as OpList under the prefix.
func (c *Counter) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	c.note(OpList, prefix)
	return c.d.List(ctx, prefix, c.countEntries(fn))
}

// ListDelimited implements backend.Driver, counted as OpListDelimited under
// the prefix.
func (c *Counter) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	c.note(OpListDelimited, prefix)
	return c.d.ListDelimited(ctx, prefix, c.countEntries(fn))
}

func (c *Counter) countEntries(fn func(backend.ObjectInfo) error) func(backend.ObjectInfo) error {
	return func(o backend.ObjectInfo) error {
		c.listed.Add(1)
		return fn(o)
	}
}

// Delete implements backend.Driver, counted as OpDelete.
func (c *Counter) Delete(ctx context.Context, key string) error {
	c.note(OpDelete, key)
	return c.d.Delete(ctx, key)
}

// Capabilities forwards to the wrapped driver (not counted).
func (c *Counter) Capabilities() backend.Capabilities { return c.d.Capabilities() }

// ErrorCode forwards to the wrapped driver (not counted).
func (c *Counter) ErrorCode(err error) backend.Code { return c.d.ErrorCode(err) }

// Close closes the wrapped driver (not counted).
func (c *Counter) Close() error { return c.d.Close() }

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

type countingSource struct {
	r io.Reader
	n *atomic.Int64
}

func (s *countingSource) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n.Add(int64(n))
	return n, err
}

// Package memstore is a small in-memory backend.Driver: a map guarded by a
// mutex, atomic whole-object writes, create-if-absent, ranged reads and
// sorted listing. It is the store the memplugin example serves, kept as a
// package so the same code can also run in-process (the plugin benchmark
// compares the two).
package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/backend"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type object struct {
	data    []byte // never modified once stored
	modTime time.Time
	crc     uint32
}

// Store is an in-memory driver. The zero value is not usable; call New.
type Store struct {
	mu      sync.RWMutex
	objects map[string]object
}

// New returns an empty Store.
func New() *Store { return &Store{objects: map[string]object{}} }

var _ backend.Driver = (*Store)(nil)

func notFound(key string) error { return fmt.Errorf("memstore: %q: %w", key, backend.ErrNotFound) }

// NewRangeReader implements backend.Driver.
func (s *Store) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	o, ok := s.objects[key]
	s.mu.RUnlock()
	if !ok {
		return nil, notFound(key)
	}
	if offset < 0 {
		return nil, fmt.Errorf("memstore: negative offset %d", offset)
	}
	d := o.data
	if offset >= int64(len(d)) {
		d = nil
	} else {
		d = d[offset:]
	}
	if length >= 0 && length < int64(len(d)) {
		d = d[:length]
	}
	return &ctxReader{ctx: ctx, r: bytes.NewReader(d)}, nil
}

// ctxReader stops reading once its context is done.
type ctxReader struct {
	ctx context.Context
	r   *bytes.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (c *ctxReader) Close() error { return nil }

// Put implements backend.Driver: it buffers exactly size bytes, checking the
// context between reads, and publishes them in one step under the lock.
func (s *Store) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if opts.IfNotExists {
		s.mu.RLock()
		_, exists := s.objects[key]
		s.mu.RUnlock()
		if exists {
			return fmt.Errorf("memstore: %q: %w", key, backend.ErrAlreadyExists)
		}
	}
	buf := make([]byte, size)
	var got int64
	for got < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := r.Read(buf[got:])
		got += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("memstore: write %q: %w", key, err)
		}
	}
	if got != size {
		return fmt.Errorf("memstore: write %q: got %d of %d bytes: %w", key, got, size, backend.ErrSizeMismatch)
	}
	// The source must end exactly here.
	var one [1]byte
	for {
		n, err := r.Read(one[:])
		if n > 0 {
			return fmt.Errorf("memstore: write %q: source longer than %d bytes: %w", key, size, backend.ErrSizeMismatch)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("memstore: write %q: %w", key, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sum := crc32.Checksum(buf, castagnoli)
	if opts.CRC32C != nil && *opts.CRC32C != sum {
		return fmt.Errorf("memstore: write %q: body CRC32C %08x, declared %08x", key, sum, *opts.CRC32C)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.objects[key]; exists && opts.IfNotExists {
		return fmt.Errorf("memstore: %q: %w", key, backend.ErrAlreadyExists)
	}
	s.objects[key] = object{data: buf, modTime: time.Now(), crc: sum}
	return nil
}

// Stat implements backend.Driver.
func (s *Store) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	if err := ctx.Err(); err != nil {
		return backend.Attributes{}, err
	}
	s.mu.RLock()
	o, ok := s.objects[key]
	s.mu.RUnlock()
	if !ok {
		return backend.Attributes{}, notFound(key)
	}
	crc := o.crc
	return backend.Attributes{Size: int64(len(o.data)), ModTime: o.modTime, CRC32C: &crc}, nil
}

// List implements backend.Driver. It snapshots the matching keys, then calls
// fn without holding the lock.
func (s *Store) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	s.mu.RLock()
	var infos []backend.ObjectInfo
	for k, o := range s.objects {
		if strings.HasPrefix(k, prefix) {
			infos = append(infos, backend.ObjectInfo{Key: k, Size: int64(len(o.data)), ModTime: o.modTime})
		}
	}
	s.mu.RUnlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	return deliver(ctx, infos, fn)
}

// deliver calls fn for each of a listing's snapshot entries.
func deliver(ctx context.Context, infos []backend.ObjectInfo, fn func(backend.ObjectInfo) error) error {
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// ListDelimited implements backend.Driver: the keys under prefix are
// grouped at the next "/" into common prefixes, each reported once.
func (s *Store) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	s.mu.RLock()
	var infos []backend.ObjectInfo
	seen := map[string]bool{}
	for k, o := range s.objects {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if i := strings.Index(rest, backend.Delimiter); i >= 0 {
			if p := prefix + rest[:i+1]; !seen[p] {
				seen[p] = true
				infos = append(infos, backend.ObjectInfo{Key: p, IsPrefix: true})
			}
			continue
		}
		infos = append(infos, backend.ObjectInfo{Key: k, Size: int64(len(o.data)), ModTime: o.modTime})
	}
	s.mu.RUnlock()
	return deliver(ctx, infos, fn)
}

// Delete implements backend.Driver.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.objects, key)
	s.mu.Unlock()
	return nil
}

// Capabilities implements backend.Driver.
func (s *Store) Capabilities() backend.Capabilities {
	return backend.Capabilities{CreateIfAbsent: true}
}

// ErrorCode implements backend.Driver.
func (s *Store) ErrorCode(err error) backend.Code {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return backend.CodeCanceled
	}
	return backend.CodeOf(err)
}

// Close implements backend.Driver. The objects stay: a Store lives as long
// as the process that holds it.
func (s *Store) Close() error { return nil }

package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
)

// readItem is one ranged read of ckpt_read_items: length bytes of key at
// offset, scattered into dsts in turn.
type readItem struct {
	key    string
	offset int64
	length int64
	dsts   [][]byte
}

// ckpt_read_items reads n items of the store at once, up to conc of them
// in flight (conc <= 0: one), under cancellation token tok (0: none). Item
// i is one ranged read of keys[i] at offsets[i] whose bytes land, in turn,
// in nsegs[i] C buffers: the item's segments, taken in order from the
// flattened arrays seg_ptrs/seg_lens (so an item's bytes can go straight
// into a caller's tensor, with only the parts around it in a scratch
// buffer). When crcs is not NULL, crcs[i] receives the CRC32C of item i's
// bytes (all its segments, in order), computed in 256 KiB pieces as they
// land, while they are in cache; with crcs NULL nothing is hashed. The
// call blocks until every item is read or one failed: then the reads in
// flight are cancelled, *failed (when not NULL) receives the index of the
// item whose error is returned, and the message names its object URL,
// offset and length. Buffers of items not yet finished may hold partial
// data after a failure.
//
//export ckpt_read_items
func ckpt_read_items(tok, h C.uintptr_t, n C.int, keys **C.char, offsets *C.int64_t, nsegs *C.int32_t,
	segLens *C.int64_t, segPtrs *unsafe.Pointer, crcs *C.uint32_t, conc C.int, failed *C.int,
	cls *C.int, rule, msg **C.char) C.int {
	if failed != nil {
		*failed = -1
	}
	return guard("ckpt_read_items", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			if n < 0 || (n > 0 && (keys == nil || offsets == nil || nsegs == nil)) {
				return fmt.Errorf("%w: %d items", errUsage, n)
			}
			if n == 0 {
				return nil
			}
			items, err := readItems(int(n), keys, offsets, nsegs, segLens, segPtrs)
			if err != nil {
				return err
			}
			bad, err := readAll(ctx, sh, items, crcs, int(conc))
			if err != nil && failed != nil {
				*failed = C.int(bad)
			}
			return err
		})
	})
}

// readAll reads items, up to conc at once, each item's CRC32C into crcs
// (when not NULL); on failure it returns the index of the item whose
// error it returns.
func readAll(ctx context.Context, sh *storeHandle, items []readItem, crcs *C.uint32_t, conc int) (int, error) {
	var sums []uint32
	if crcs != nil {
		sums = unsafe.Slice((*uint32)(unsafe.Pointer(crcs)), len(items))
	}
	var mu sync.Mutex
	bad := -1
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, conc))
	for i := range items {
		it := &items[i]
		g.Go(func() error {
			var tap backend.Tap
			var sum *segmentCRCs
			if sums != nil {
				// One segment the item's length: one CRC over all its
				// destinations (ReadRangeInto's pieces never cross one).
				sum = &segmentCRCs{lens: []int64{it.length}, crcs: make([]uint32, 1)}
				tap = sum
			}
			if err := sh.st.ReadRangeInto(ctx, it.key, it.offset, it.dsts, tap); err != nil {
				mu.Lock()
				if bad < 0 && ctx.Err() == nil {
					bad = i // the first failure: its error is the group's
				}
				mu.Unlock()
				return fmt.Errorf("read %s at offset %d (%d bytes): %w", sh.st.URL(it.key), it.offset, it.length, err)
			}
			if sum != nil {
				sums[i] = sum.crcs[0]
			}
			return nil
		})
	}
	err := g.Wait()
	mu.Lock()
	defer mu.Unlock()
	return bad, err
}

// readItems turns ckpt_read_items' C arrays into items, checking every
// length and pointer.
func readItems(n int, keys **C.char, offsets *C.int64_t, nsegs *C.int32_t, segLens *C.int64_t,
	segPtrs *unsafe.Pointer) ([]readItem, error) {
	ks := unsafe.Slice(keys, n)
	offs := unsafe.Slice((*int64)(unsafe.Pointer(offsets)), n)
	counts := unsafe.Slice((*int32)(unsafe.Pointer(nsegs)), n)
	total := 0
	for i, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("%w: item %d has %d segments", errUsage, i, c)
		}
		total += int(c)
	}
	if total > 0 && (segLens == nil || segPtrs == nil) {
		return nil, fmt.Errorf("%w: %d segments without lengths or buffers", errUsage, total)
	}
	var lens []int64
	var ptrs []unsafe.Pointer
	if total > 0 {
		lens = unsafe.Slice((*int64)(unsafe.Pointer(segLens)), total)
		ptrs = unsafe.Slice(segPtrs, total)
	}
	dsts := make([][]byte, total)
	items := make([]readItem, n)
	s := 0
	for i := range items {
		if ks[i] == nil || offs[i] < 0 {
			return nil, fmt.Errorf("%w: item %d: key %v, offset %d", errUsage, i, ks[i] != nil, offs[i])
		}
		it := &items[i]
		it.key, it.offset = C.GoString(ks[i]), offs[i]
		it.dsts = dsts[s : s+int(counts[i]) : s+int(counts[i])]
		for j := range it.dsts {
			l, p := lens[s+j], ptrs[s+j]
			if l < 0 || (l > 0 && p == nil) {
				return nil, fmt.Errorf("%w: item %d segment %d: length %d, buffer %v", errUsage, i, j, l, p != nil)
			}
			it.dsts[j] = cbytes(p, C.int64_t(l))
			it.length += l
		}
		s += int(counts[i])
	}
	return items, nil
}

package saver

import (
	"sort"

	"github.com/ckptkit/ckptkit/internal/crc32c"
	"github.com/ckptkit/ckptkit/planner"
)

// itemCRCTap computes the CRC32C of each item of an object's body (the
// items' byte ranges, back to back from the start) from the pieces a
// backend.SlicesReader hands it while the upload copies or writes them:
// one pass over the bytes, while they are in the cache, independent of how
// the body is split into parts. A rewound upload hands pieces again; bytes
// already hashed are skipped (they have not changed).
type itemCRCTap struct {
	ends   []int64  // per item: its end in the stream
	hashed []int64  // per item: the stream position up to which crcs covers it
	crcs   []uint32 // per item: CRC32C of its bytes up to hashed
}

func newItemCRCTap(items []planner.WriteItem) *itemCRCTap {
	t := &itemCRCTap{ends: make([]int64, len(items)), hashed: make([]int64, len(items)), crcs: make([]uint32, len(items))}
	var end int64
	for k, it := range items {
		t.hashed[k] = end
		end += it.Length
		t.ends[k] = end
	}
	return t
}

// Piece implements backend.PieceTap: b is the stream's bytes at pos.
func (t *itemCRCTap) Piece(pos int64, b []byte) {
	end := pos + int64(len(b))
	for k := sort.Search(len(t.ends), func(k int) bool { return t.ends[k] > pos }); k < len(t.ends); k++ {
		if h := t.hashed[k]; h >= pos && h < end {
			to := min(end, t.ends[k])
			t.crcs[k] = crc32c.Update(t.crcs[k], b[h-pos:to-pos])
			t.hashed[k] = to
		}
		if t.ends[k] >= end {
			break
		}
	}
}

// CRCs returns each item's CRC32C and true when every byte of every item
// went through the tap (false: compute them another way).
func (t *itemCRCTap) CRCs() ([]uint32, bool) {
	for k := range t.ends {
		if t.hashed[k] != t.ends[k] {
			return nil, false
		}
	}
	return t.crcs, true
}

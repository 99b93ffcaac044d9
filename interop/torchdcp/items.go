package torchdcp

import (
	"errors"
	"fmt"
	"sort"

	"github.com/ckptkit/ckptkit/internal/crc32c"
	"github.com/ckptkit/ckptkit/metadata"
)

// Coalescing of the bytes-item reads of CheckBytesItems: items of one
// object closer than itemsGap are read together, in reads of at most
// itemsMaxRead bytes (a larger item is a read of its own).
const (
	itemsGap     = 256 << 10
	itemsMaxRead = 16 << 20
	// itemsCacheMax bounds the items kept for FillIteration and FillParams.
	itemsCacheMax = 16 << 20
)

// CheckBytesItems decodes every bytes item of c with the restricted
// unpickler, so that no item of a checkpoint that opens can run code
// wherever it is unpickled later (torch's DCP planner unpickles bytes items
// with torch.load(weights_only=False)). An item whose pickle names a global
// outside the allow-list fails with the *ForbiddenGlobalError
// (ErrForbiddenGlobal), and one the unpickler cannot read to its end (a
// refused opcode such as INST, which could name a global too) with
// ErrMalformed, both naming the key; a well-formed value that is not plain
// data (ErrOpaque: tensors, containers with other keys) is fine. An item
// whose bytes do not match its recorded CRC32C is left to the checksum
// checks of loads and verify --deep, which report it as such.
//
// Items of an object are read in coalesced ranges. It returns a reader
// that serves the items it read (up to itemsCacheMax bytes of them) from
// memory and reads anything else through read.
func CheckBytesItems(c *metadata.Checkpoint, read ItemReader) (ItemReader, error) {
	type span struct {
		object         string
		offset, length int64
		entry          int
	}
	var items []span
	for i, b := range c.Bytes {
		if b.Encoding == EncodingBytes {
			items = append(items, span{b.Object, b.Offset, b.Length, i})
		}
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].object != items[j].object {
			return items[i].object < items[j].object
		}
		return items[i].offset < items[j].offset
	})
	type rng struct {
		object         string
		offset, length int64
	}
	cache := map[rng][]byte{}
	cached := 0
	check := func(it span, stored []byte) error {
		b := &c.Bytes[it.entry]
		if b.CRC32C != 0 && crc32c.Checksum(stored) != b.CRC32C {
			return nil // a checksum problem, reported where the CRC32Cs are checked
		}
		if _, err := DecodeValue(stored); err != nil && !errors.Is(err, ErrOpaque) {
			return fmt.Errorf("bytes item %q (%s at offset %d, %d bytes): %w", b.Key, b.Object, b.Offset, b.Length, err)
		}
		if cached+len(stored) <= itemsCacheMax {
			cache[rng{it.object, it.offset, it.length}] = stored
			cached += len(stored)
		}
		return nil
	}
	for i := 0; i < len(items); {
		start, end := items[i].offset, items[i].offset+items[i].length
		j := i + 1
		for ; j < len(items) && items[j].object == items[i].object; j++ {
			next := items[j]
			if next.offset > end+itemsGap || max(end, next.offset+next.length)-start > itemsMaxRead {
				break
			}
			end = max(end, next.offset+next.length)
		}
		buf, err := read(items[i].object, start, end-start)
		if err != nil {
			return nil, fmt.Errorf("read bytes items of %s: %w", items[i].object, err)
		}
		for _, it := range items[i:j] {
			if err := check(it, buf[it.offset-start:it.offset-start+it.length:it.offset-start+it.length]); err != nil {
				return nil, err
			}
		}
		i = j
	}
	return func(object string, offset, length int64) ([]byte, error) {
		if b, ok := cache[rng{object, offset, length}]; ok {
			return b, nil
		}
		return read(object, offset, length)
	}, nil
}

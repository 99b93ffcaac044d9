package crc32c_test

import (
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/ckptkit/ckptkit/internal/crc32c"
)

var std = crc32.MakeTable(crc32.Castagnoli)

// Every length around the folding threshold and the block boundaries, at
// every alignment, with a non-zero incoming CRC, matches hash/crc32.
func TestUpdateMatchesHashCRC32(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 64<<10+64)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	lengths := []int{0, 1, 7, 255, 256, 1000}
	for n := max(0, crc32c.FoldMin-300); n <= crc32c.FoldMin+1100; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 64<<10-1, 64<<10)
	for _, n := range lengths {
		for _, off := range []int{0, 1, 3, 13, 63} {
			p := buf[off : off+n]
			seed := rng.Uint32()
			if got, want := crc32c.Update(seed, p), crc32.Update(seed, std, p); got != want {
				t.Fatalf("Update(%08x, %d bytes at offset %d) = %08x, hash/crc32 says %08x", seed, n, off, got, want)
			}
		}
	}
}

// Known values: the CRC-32C check value and all-zero/all-one blocks long
// enough to take the folding path.
func TestKnownValues(t *testing.T) {
	if got := crc32c.Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("check value %08x, want e3069283", got)
	}
	zeros := make([]byte, 1<<20)
	if got, want := crc32c.Checksum(zeros), crc32.Checksum(zeros, std); got != want {
		t.Fatalf("1 MiB of zeros: %08x, want %08x", got, want)
	}
	ones := make([]byte, 1<<20)
	for i := range ones {
		ones[i] = 0xff
	}
	if got, want := crc32c.Checksum(ones), crc32.Checksum(ones, std); got != want {
		t.Fatalf("1 MiB of 0xff: %08x, want %08x", got, want)
	}
}

// Split anywhere, the running CRC is the CRC of the whole (the way the
// loader checks a chunk whose bytes arrive in pieces), and the hash.Hash32
// agrees with it.
func TestPiecesAndHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 200_000)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	want := crc32.Checksum(buf, std)
	for range 50 {
		h := crc32c.New()
		crc := uint32(0)
		for p := buf; len(p) > 0; {
			k := min(len(p), rng.IntN(9000))
			crc = crc32c.Update(crc, p[:k])
			h.Write(p[:k])
			p = p[k:]
		}
		if crc != want || h.Sum32() != want {
			t.Fatalf("pieces: Update %08x, hash %08x, want %08x", crc, h.Sum32(), want)
		}
	}
	h := crc32c.New()
	h.Write(buf)
	ref := crc32.New(std)
	ref.Write(buf)
	if string(h.Sum([]byte("x"))) != string(ref.Sum([]byte("x"))) {
		t.Fatalf("Sum %x, hash/crc32 %x", h.Sum(nil), ref.Sum(nil))
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 5000))
	f.Add(uint32(0xdeadbeef), []byte("123456789"))
	f.Fuzz(func(t *testing.T, seed uint32, p []byte) {
		if got, want := crc32c.Update(seed, p), crc32.Update(seed, std, p); got != want {
			t.Fatalf("Update(%08x, %d bytes) = %08x, hash/crc32 %08x", seed, len(p), got, want)
		}
	})
}

// cancelAfter is a context whose Err turns to context.Canceled after it
// has been looked at n times: cancellation landing in the middle of a
// buffer.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n == 0 {
		return context.Canceled
	}
	c.n--
	return nil
}

// UpdateContext matches Update over a buffer of several pieces, and a
// context cancelled in the middle stops it at the next piece with the
// checksum of the pieces done.
func TestUpdateContext(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 3*crc32c.Piece+12345)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	got, err := crc32c.UpdateContext(context.Background(), 7, buf)
	if err != nil || got != crc32c.Update(7, buf) {
		t.Fatalf("UpdateContext = %08x, %v; Update says %08x", got, err, crc32c.Update(7, buf))
	}
	got, err = crc32c.UpdateContext(&cancelAfter{Context: context.Background(), n: 2}, 7, buf)
	if !errors.Is(err, context.Canceled) || got != crc32c.Update(7, buf[:2*crc32c.Piece]) {
		t.Fatalf("cancelled after two pieces: %08x, %v; want %08x, context.Canceled", got, err, crc32c.Update(7, buf[:2*crc32c.Piece]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err := crc32c.UpdateContext(ctx, 7, buf); !errors.Is(err, context.Canceled) || got != 7 {
		t.Fatalf("cancelled before: %08x, %v", got, err)
	}
}

//go:build linux

package wire

import (
	"errors"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
)

// FuzzFrames feeds arbitrary bytes as the frames of the shared-memory bulk
// path a peer process sends, a read chunk (plugin to host) and a put
// acknowledgement (plugin to host), against a real segment, and arbitrary
// text as the segment description the plugin process inherits. A slot
// reference must either be refused (shm.ErrBadRef) or name bytes inside
// that one slot, never past it; a description that parses must describe a
// layout within the package limits that encodes back to itself.
func FuzzFrames(f *testing.F) {
	layout := shm.Layout{SlotSize: shm.MinSlotSize, PutSlots: 2, ReadSlots: 3}
	seg, file, err := shm.Create(layout)
	if err != nil {
		f.Skipf("no shared memory: %v", err)
	}
	f.Cleanup(func() { seg.Close(); file.Close() })
	add := func(m proto.Message, env string) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, env)
	}
	add(&pb.ReadChunk{Data: []byte("inline bytes")}, layout.Env(3))
	add(&pb.ReadChunk{Shm: &pb.ShmRef{Slot: 2, Length: shm.MinSlotSize}}, "fd=3,slot=65536,put=1,read=1")
	add(&pb.ReadChunk{Shm: &pb.ShmRef{Slot: 3, Length: 1}}, "fd=3,slot=67108864,put=128,read=128")
	add(&pb.PutShmReply{Ack: &pb.ShmRef{Slot: 1, Length: 7}}, "fd=9,slot=65536,put=2,read=3,slot=1")
	add(&pb.PutShmReply{Ack: &pb.ShmRef{Slot: 1 << 31, Length: ^uint32(0)}}, "fd=3,slot=-1,put=1,read=1")

	// inSlot checks that b lies within slot, which starts at base.
	inSlot := func(t *testing.T, what string, b, slot []byte, n uint32) {
		if len(b) != int(n) || cap(b) != int(n) {
			t.Fatalf("%s: %d bytes (capacity %d) for a reference of %d", what, len(b), cap(b), n)
		}
		if n == 0 {
			return
		}
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(slot)))
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if p != lo || int(n) > len(slot) {
			t.Fatalf("%s: reference at %#x+%d outside its slot %#x+%d", what, p, n, lo, len(slot))
		}
	}
	check := func(t *testing.T, what string, ref *pb.ShmRef, slots int, get func(i, n uint32) ([]byte, error), whole func(i uint32) ([]byte, error)) {
		i, n := ref.GetSlot(), ref.GetLength()
		b, err := get(i, n)
		valid := uint64(i) < uint64(slots) && uint64(n) <= uint64(layout.SlotSize)
		switch {
		case err != nil && !errors.Is(err, shm.ErrBadRef):
			t.Fatalf("%s %d+%d: unclassified error %v", what, i, n, err)
		case err != nil && valid:
			t.Fatalf("%s %d+%d refused: %v", what, i, n, err)
		case err == nil && !valid:
			t.Fatalf("%s %d+%d accepted outside the segment's %d slots of %d bytes", what, i, n, slots, layout.SlotSize)
		case err == nil:
			slot, err := whole(i)
			if err != nil {
				t.Fatal(err)
			}
			inSlot(t, what, b, slot, n)
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, env string) {
		var rc pb.ReadChunk
		if proto.Unmarshal(frame, &rc) == nil && rc.GetShm() != nil {
			check(t, "read slot", rc.GetShm(), layout.ReadSlots, seg.ReadRef, seg.ReadSlot)
		}
		var ack pb.PutShmReply
		if proto.Unmarshal(frame, &ack) == nil && ack.GetAck() != nil {
			check(t, "put slot", ack.GetAck(), layout.PutSlots, seg.PutRef, seg.PutSlot)
		}
		l, fd, err := shm.ParseEnv(env)
		if err != nil {
			return
		}
		if l.Validate() != nil || l.Size() > shm.MaxSlots*shm.MaxSlotSize || fd < 0 {
			t.Fatalf("%q parsed to %+v, fd %d, outside the limits", env, l, fd)
		}
		if l2, fd2, err := shm.ParseEnv(l.Env(fd)); err != nil || l2 != l || fd2 != fd {
			t.Fatalf("%q: %+v fd %d does not encode back to itself (%+v fd %d, %v)", env, l, fd, l2, fd2, err)
		}
	})
}

//go:build linux

package host

import (
	"context"
	"io"
	"testing"

	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReaderRefusesBadSlotReferences feeds the host's reader chunks a
// broken or hostile plugin could send: none may make it read outside the
// segment, and each ends the read with an error.
func TestReaderRefusesBadSlotReferences(t *testing.T) {
	l := shm.Layout{SlotSize: shm.MinSlotSize, PutSlots: 1, ReadSlots: 2}
	for name, chunk := range map[string]*pb.ReadChunk{
		"slot past the read slots": {Shm: &pb.ShmRef{Slot: 2, Length: 1}},
		"huge slot":                {Shm: &pb.ShmRef{Slot: 1 << 31, Length: 1}},
		"length past the slot":     {Shm: &pb.ShmRef{Slot: 1, Length: shm.MinSlotSize + 1}},
		"maximal length":           {Shm: &pb.ShmRef{Slot: 0, Length: ^uint32(0)}},
		"data and slot at once":    {Data: []byte("x"), Shm: &pb.ShmRef{Slot: 0, Length: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			seg, f, err := shm.Create(l)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			require.True(t, seg.Acquire())
			seg.Close()
			in := &instance{ctx: context.Background()}
			cctx, cancel := context.WithCancel(context.Background())
			sent := false
			r := &reader{
				d: &driver{p: &Plugin{Name: "hostile"}}, in: in, ctx: context.Background(), cctx: cctx, cancel: cancel,
				seg: seg, slot: -1, ack: func(uint32) error { return nil },
				recv: func() (*pb.ReadChunk, error) {
					if sent {
						return nil, io.EOF
					}
					sent = true
					return chunk, nil
				},
			}
			_, err = io.ReadAll(r)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "plugin sent")
			assert.Error(t, cctx.Err(), "the call was not cancelled")
			assert.Nil(t, r.seg, "the segment reference was not released")
		})
	}
}

//go:build linux

package shm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var testLayout = Layout{SlotSize: MinSlotSize, PutSlots: 2, ReadSlots: 3}

func TestEnvRoundTrip(t *testing.T) {
	l, fd, err := ParseEnv(testLayout.Env(3))
	require.NoError(t, err)
	assert.Equal(t, testLayout, l)
	assert.Equal(t, 3, fd)
	for _, bad := range []string{"", "fd=3", "slot=65536,put=1,read=1", "fd=3,slot=1,put=1,read=1",
		"fd=3,slot=65536,put=0,read=1", "fd=3,slot=65536,put=1,read=1,x=2", "fd=-1,slot=65536,put=1,read=1", "fd=3,slot=65536,put=999,read=1"} {
		_, _, err := ParseEnv(bad)
		assert.Error(t, err, bad)
	}
}

func TestSegmentBoundsAndSeals(t *testing.T) {
	seg, f, err := Create(testLayout)
	require.NoError(t, err)
	defer seg.Close()

	// The plugin cannot shrink or grow the memfd under the host's mapping.
	assert.Error(t, unix.Ftruncate(int(f.Fd()), 0))
	assert.Error(t, unix.Ftruncate(int(f.Fd()), int64(2*testLayout.Size())))

	peer, err := Map(f, testLayout)
	require.NoError(t, err)
	defer peer.Close()
	w, err := seg.PutSlot(1)
	require.NoError(t, err)
	copy(w, "hello")
	got, err := peer.PutRef(1, 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	rs, err := peer.ReadSlot(2)
	require.NoError(t, err)
	copy(rs, "world")
	got, err = seg.ReadRef(2, 5)
	require.NoError(t, err)
	assert.Equal(t, "world", string(got))
	assert.Equal(t, 5, cap(got), "a reference must not reach past its length")

	for _, tc := range []struct {
		put  bool
		i, n uint32
	}{{true, 2, 1}, {false, 3, 1}, {true, 1 << 31, 1}, {false, 0, MinSlotSize + 1}, {true, 0, ^uint32(0)}} {
		var err error
		if tc.put {
			_, err = seg.PutRef(tc.i, tc.n)
		} else {
			_, err = seg.ReadRef(tc.i, tc.n)
		}
		assert.ErrorIs(t, err, ErrBadRef, "%+v", tc)
	}

	// A wrong size is refused.
	_, f2, err := Create(testLayout)
	require.NoError(t, err)
	_, err = Map(f2, Layout{SlotSize: MinSlotSize, PutSlots: 1, ReadSlots: 1})
	assert.Error(t, err)
}

func TestCloseWaitsForReferences(t *testing.T) {
	seg, f, err := Create(testLayout)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.True(t, seg.Acquire())
	seg.Close()
	assert.False(t, seg.Acquire(), "a closed segment hands out no references")
	b, err := seg.PutSlot(0)
	require.NoError(t, err)
	b[0] = 1 // still mapped: a reference is held
	seg.Release()
	assert.Nil(t, seg.mem)
	seg.Close() // idempotent
}

func TestPool(t *testing.T) {
	p := NewPool(3)
	got := p.TryGet(2)
	assert.Len(t, got, 2)
	assert.Len(t, p.TryGet(5), 1)
	assert.Empty(t, p.TryGet(1))
	p.Put(got...)
	assert.Equal(t, 2, p.Free())
}

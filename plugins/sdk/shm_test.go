//go:build linux

package sdk

import (
	"context"
	"testing"

	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSharedMemoryNegotiation: the plugin accepts the shared-memory path
// only when the host offers it and the segment was mapped.
func TestSharedMemoryNegotiation(t *testing.T) {
	cfg := Config{Name: "n", Schemes: []string{"n"}}
	l := shm.Layout{SlotSize: shm.MinSlotSize, PutSlots: 1, ReadSlots: 1}
	seg, f, err := shm.Create(l)
	require.NoError(t, err)
	defer seg.Close()
	defer f.Close()

	ctx := context.Background()
	offer := &pb.DescribeRequest{HostProtocolMinor: wire.ProtocolMinor, HostFeatures: []string{wire.FeatureSharedMemory}}
	plain := newServer(cfg, hclog.NewNullLogger())
	resp, err := plain.Describe(ctx, offer)
	require.NoError(t, err)
	assert.Empty(t, resp.GetFeatures(), "no segment, yet shared memory accepted")
	assert.Equal(t, uint32(wire.ProtocolMinor), resp.GetProtocolMinor())

	with := newServer(cfg, hclog.NewNullLogger())
	dup, err := f.Stat()
	require.NoError(t, err)
	require.Equal(t, int64(l.Size()), dup.Size())
	// The SDK maps (and closes) what the environment describes: a copy of f.
	fd, err := unix.Dup(int(f.Fd()))
	require.NoError(t, err)
	require.NoError(t, with.mapSegment(l.Env(fd)))
	resp, err = with.Describe(ctx, offer)
	require.NoError(t, err)
	assert.Equal(t, []string{wire.FeatureSharedMemory}, resp.GetFeatures())
	resp, err = with.Describe(ctx, &pb.DescribeRequest{})
	require.NoError(t, err)
	assert.Empty(t, resp.GetFeatures(), "an older host did not offer shared memory")

	assert.Error(t, newServer(cfg, hclog.NewNullLogger()).mapSegment("fd=999,slot=65536,put=1,read=1"))
	assert.Error(t, newServer(cfg, hclog.NewNullLogger()).mapSegment("garbage"))
}

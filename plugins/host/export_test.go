package host

import (
	"context"

	pb "github.com/ckptkit/ckptkit/plugins/proto"
)

// RawClient returns the generated gRPC client of p's running process, for
// tests that speak the wire protocol directly (truncated write streams).
func RawClient(ctx context.Context, p *Plugin) (pb.StorageClient, error) {
	in, err := p.live(ctx)
	if err != nil {
		return nil, err
	}
	return in.rpc, nil
}

// UsesSharedMemory tells whether p's running process accepted the
// shared-memory bulk path.
func UsesSharedMemory(ctx context.Context, p *Plugin) (bool, error) {
	in, err := p.live(ctx)
	if err != nil {
		return false, err
	}
	return in.putPool != nil, nil
}

// FreeSlots returns how many put slots of p's running process are free.
func FreeSlots(ctx context.Context, p *Plugin) (int, error) {
	in, err := p.live(ctx)
	if err != nil || in.putPool == nil {
		return 0, err
	}
	return in.putPool.Free(), nil
}

// RawPutSlot returns put slot i of p's running process, for tests that
// speak PutShm directly. The caller must not run writes through p meanwhile.
func RawPutSlot(ctx context.Context, p *Plugin, i uint32) ([]byte, error) {
	in, err := p.live(ctx)
	if err != nil {
		return nil, err
	}
	return in.seg.PutSlot(i)
}

// SetShmThreshold sets the size from which bodies take the shared-memory
// path and returns a function restoring the previous value.
func SetShmThreshold(n int64) func() {
	old := shmThreshold
	shmThreshold = n
	return func() { shmThreshold = old }
}

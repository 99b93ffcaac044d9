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

package sdk

import (
	"context"
	"hash/crc32"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// naiveDriver publishes as soon as it has read size bytes, without looking
// for EOF: the kind of driver the SDK must protect from truncated streams.
type naiveDriver struct {
	backend.Driver
	mu   sync.Mutex
	objs map[string][]byte
}

func (d *naiveDriver) Put(_ context.Context, key string, size int64, r io.Reader, _ backend.PutOptions) error {
	buf := make([]byte, size)
	if _, err := io.ReadFull(r, buf); err != nil {
		return err
	}
	d.mu.Lock()
	d.objs[key] = buf
	d.mu.Unlock()
	return nil
}

func (d *naiveDriver) Capabilities() backend.Capabilities { return backend.Capabilities{} }
func (d *naiveDriver) ErrorCode(err error) backend.Code   { return backend.CodeOf(err) }

func startServer(t *testing.T, drv backend.Driver) (pb.StorageClient, string) {
	t.Helper()
	cfg := Config{Name: "naive", Schemes: []string{"naive"}, Open: func(context.Context, *url.URL) (backend.Driver, string, error) {
		return drv, "", nil
	}}
	require.NoError(t, cfg.validate())
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	pb.RegisterStorageServer(s, newServer(cfg, hclog.NewNullLogger()))
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := pb.NewStorageClient(conn)
	resp, err := c.Open(context.Background(), &pb.OpenRequest{Url: "naive://x"})
	require.NoError(t, err)
	return c, resp.GetHandle()
}

func TestCommitFrameProtectsNaiveDriver(t *testing.T) {
	drv := &naiveDriver{objs: map[string][]byte{}}
	c, h := startServer(t, drv)
	body := []byte("hello, plugin")
	put := func(key string, withCommit bool, count int64, sum uint32) error {
		s, err := c.Put(context.Background())
		require.NoError(t, err)
		require.NoError(t, s.Send(&pb.PutFrame{Frame: &pb.PutFrame_Header{Header: &pb.PutHeader{Handle: h, Key: key, Size: int64(len(body))}}}))
		require.NoError(t, s.Send(&pb.PutFrame{Frame: &pb.PutFrame_Data{Data: &pb.PutData{Data: body}}}))
		if withCommit {
			require.NoError(t, s.Send(&pb.PutFrame{Frame: &pb.PutFrame_Commit{Commit: &pb.PutCommit{Count: count, Crc32C: sum}}}))
		}
		_, err = s.CloseAndRecv()
		return err
	}
	sum := crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))

	assert.Error(t, put("nocommit", false, 0, 0))
	assert.Error(t, put("badcrc", true, int64(len(body)), sum^1))
	assert.Error(t, put("badcount", true, 3, sum))
	require.NoError(t, put("good", true, int64(len(body)), sum))
	assert.Equal(t, map[string][]byte{"good": body}, drv.objs)

	_, err := c.Describe(context.Background(), &pb.DescribeRequest{})
	require.NoError(t, err)
	_, err = c.Stat(context.Background(), &pb.StatRequest{Handle: "nope", Key: "k"})
	assert.Error(t, err)
}

func TestConfigValidation(t *testing.T) {
	open := func(context.Context, *url.URL) (backend.Driver, string, error) { return nil, "", nil }
	assert.NoError(t, Config{Name: "a", Schemes: []string{"my-fs+v1"}, Open: open}.validate())
	assert.Error(t, Config{Schemes: []string{"x"}, Open: open}.validate())
	assert.Error(t, Config{Name: "a", Open: open}.validate())
	assert.Error(t, Config{Name: "a", Schemes: []string{"MyFS"}, Open: open}.validate())
	assert.Error(t, Config{Name: "a", Schemes: []string{"x"}}.validate())
}

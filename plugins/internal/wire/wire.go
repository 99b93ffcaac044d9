// Package wire holds what the plugin host and the plugin SDK share besides the
// generated protocol: the go-plugin handshake, size limits, the go-plugin
// glue, and the mapping of portable error codes to and from gRPC statuses.
package wire

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Protocol versions. The major is negotiated by go-plugin's handshake (a
// later major can be served next to this one through VersionedPlugins); the
// minor is exchanged in Describe and only ever adds fields or RPCs.
const (
	ProtocolMajor = 1
	//
	// Minor 1 added the shared-memory bulk path; minor 2 the delimited
	// (one-level) List.
	ProtocolMinor = 2
)

// FeatureSharedMemory names the shared-memory bulk path (minor 1): the host
// offers it in DescribeRequest.host_features when it passed the process a
// segment (described by EnvSharedMemory), and the plugin lists it in
// DescribeResponse.features when it mapped that segment. Only then does the
// host use ReadShm and PutShm.
const FeatureSharedMemory = "shm-v1"

// EnvSharedMemory describes the segment inherited by the plugin process
// (see shm.Layout.Env).
const EnvSharedMemory = "CKPTKIT_PLUGIN_SHM"

// PluginKey names the storage service in go-plugin's plugin set.
const PluginKey = "storage"

// Size limits. Data travels in ChunkSize frames; the SDK refuses data frames
// above MaxFrameSize; gRPC refuses messages above MaxMsgSize. All are far
// below the 2 GiB protobuf limit.
const (
	ChunkSize    = 1 << 20
	MaxFrameSize = 4 << 20
	MaxMsgSize   = 16 << 20
)

// EnvParentPID is set by the host to its process id; the SDK exits when its
// parent is no longer that process.
const EnvParentPID = "CKPTKIT_PLUGIN_PARENT_PID"

// Handshake is the go-plugin handshake. The cookie only keeps a plugin binary
// from being run by hand by mistake; it is not a security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolMajor,
	MagicCookieKey:   "CKPTKIT_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "c4a1b9e2-ckptkit-storage-plugin-7d3f",
}

// ServerOptions are the server-side message size limits and window sizes.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(16 << 20),
	}
}

// DialOptions are the client-side message size limits and window sizes.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)),
		grpc.WithInitialWindowSize(8 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
	}
}

// GRPCPlugin is the go-plugin glue. On the plugin side Impl is set; on the
// host side GRPCClient returns a *Client.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl pb.StorageServer
}

// Client is what the host gets from go-plugin's Dispense: the generated
// client and a context go-plugin cancels when the plugin process exits.
type Client struct {
	pb.StorageClient
	Done context.Context
}

// GRPCServer implements plugin.GRPCPlugin.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("ckptkit plugin: no storage server configured")
	}
	pb.RegisterStorageServer(s, p.Impl)
	return nil
}

// GRPCClient implements plugin.GRPCPlugin.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return &Client{StorageClient: pb.NewStorageClient(c), Done: ctx}, nil
}

// ToStatus turns a driver error into a gRPC status carrying code in an
// ErrorDetail. Context errors become Canceled / DeadlineExceeded.
func ToStatus(code backend.Code, err error) error {
	if err == nil {
		return nil
	}
	gc := codes.Unknown
	switch code {
	case backend.CodeNotFound:
		gc = codes.NotFound
	case backend.CodeAlreadyExists:
		gc = codes.AlreadyExists
	case backend.CodePermission:
		gc = codes.PermissionDenied
	case backend.CodeUnsupported:
		gc = codes.Unimplemented
	case backend.CodeInvalidKey:
		gc = codes.InvalidArgument
	case backend.CodeSizeMismatch:
		gc = codes.DataLoss
	case backend.CodeTransient:
		gc = codes.Unavailable
	case backend.CodeCanceled:
		gc = codes.Canceled
		if errors.Is(err, context.DeadlineExceeded) {
			gc = codes.DeadlineExceeded
		}
	}
	st := status.New(gc, err.Error())
	if withDetail, derr := st.WithDetails(&pb.ErrorDetail{Code: pb.ErrorCode(code), Message: err.Error()}); derr == nil {
		st = withDetail
	}
	return st.Err()
}

// Detail extracts the portable code a plugin attached to a status. ok is
// false for statuses without one (transport failures, gRPC's own errors).
func Detail(st *status.Status) (code backend.Code, msg string, ok bool) {
	for _, d := range st.Details() {
		if ed, isED := d.(*pb.ErrorDetail); isED {
			c := backend.Code(ed.GetCode())
			if c < backend.CodeUnknown || c > backend.CodeCanceled {
				c = backend.CodeUnknown
			}
			return c, ed.GetMessage(), true
		}
	}
	return backend.CodeUnknown, "", false
}

// Errorf builds a status error with a portable code.
func Errorf(code backend.Code, format string, args ...any) error {
	return ToStatus(code, fmt.Errorf(format, args...))
}

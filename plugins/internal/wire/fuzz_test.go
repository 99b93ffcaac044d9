package wire

import (
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ckptkit/ckptkit/backend"
)

// FuzzDetail feeds arbitrary bytes, as the status frame a plugin process
// returns, to Detail: it must never panic, and the code it returns must be
// a backend.Code (an out-of-range one becomes CodeUnknown).
func FuzzDetail(f *testing.F) {
	for c := backend.CodeUnknown; c <= backend.CodeCanceled; c++ {
		st, _ := status.FromError(Errorf(c, "seed %d", c))
		b, err := proto.Marshal(st.Proto())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x08, 0x0e, 0x1a, 0x04, 0x0a, 0x02, 0x78, 0x79})
	f.Fuzz(func(t *testing.T, data []byte) {
		var sp spb.Status
		if proto.Unmarshal(data, &sp) != nil {
			return
		}
		code, _, _ := Detail(status.FromProto(&sp))
		if code < backend.CodeUnknown || code > backend.CodeCanceled {
			t.Fatalf("code %d out of range", code)
		}
	})
}

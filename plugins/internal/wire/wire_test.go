package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCodesRoundTrip(t *testing.T) {
	for c := backend.CodeUnknown; c <= backend.CodeCanceled; c++ {
		// The proto enum mirrors backend.Code value for value.
		name := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(pb.ErrorCode(c).String(), "ERROR_CODE_")), "_", "-")
		assert.Equal(t, c.String(), name)
		err := ToStatus(c, fmt.Errorf("boom %v", c))
		st, ok := status.FromError(err)
		assert.True(t, ok)
		got, msg, ok := Detail(st)
		assert.True(t, ok)
		assert.Equal(t, c, got)
		assert.Equal(t, fmt.Sprintf("boom %v", c), msg)
	}
	st, _ := status.FromError(ToStatus(backend.CodeCanceled, fmt.Errorf("x: %w", context.DeadlineExceeded)))
	assert.Equal(t, codes.DeadlineExceeded, st.Code())
	_, _, ok := Detail(status.New(codes.Unavailable, "transport"))
	assert.False(t, ok)
	assert.NoError(t, ToStatus(backend.CodeUnknown, nil))
	assert.True(t, errors.Is(backend.CodeNotFound.Sentinel(), backend.ErrNotFound))
}

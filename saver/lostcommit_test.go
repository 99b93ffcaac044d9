package saver_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/saver"
)

// Issue 16 item 5: a commit that succeeded must not be reported as
// failed when its response is lost. The Store's retry finds the metadata
// object there (create-if-absent refuses it) and recognises its own
// bytes; this checks it end to end through a connection broken after the
// S3 server stored the metadata object.
func TestCommitWithLostResponseIsCommittedOnS3(t *testing.T) {
	ctx := context.Background()
	st, p := ckpttest.ProxiedS3(t, backend.RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	rule := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+metadata.ObjectKey)
	}, Fail: func(n int) bool { return n == 0 }, Break: faultproxy.CutBody})
	s := ckpttest.NewState(6, 8)
	_, err := saver.SaveLocal(ctx, st, s.Shard(2), saver.Options{Iteration: 6})
	require.NoError(t, err)
	require.Equal(t, 1, p.Failed(rule), "the commit's response was lost once")
	ckpttest.RequireLoads(t, st, s)
}

//go:build unix

package host_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/plugins/host"
	"github.com/stretchr/testify/require"
)

var confSeq atomic.Int64

// TestConformance runs the shared backend suite against the memplugin
// example, through a real plugin process.
func TestConformance(t *testing.T) {
	discover(t, host.Config{Dir: pluginDir(t, "memplugin")})
	conformance.Run(t, conformance.Harness{Name: "memplugin", NewStore: func(t conformance.T) *backend.Store {
		st, err := backend.Open(context.Background(), fmt.Sprintf("memplug://conf-%d/prefix", confSeq.Add(1)))
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}})
}

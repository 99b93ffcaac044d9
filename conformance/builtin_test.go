package conformance_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/conformance"
)

// TestMain prints the fs x mem summary table after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

var memSeq atomic.Int64

func TestFilesystem(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "fs", NewStore: func(t conformance.T) *backend.Store {
		st, err := backend.Open(context.Background(), t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}})
}

func TestMemory(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "mem", NewStore: func(t conformance.T) *backend.Store {
		name := fmt.Sprintf("conf-%d", memSeq.Add(1))
		st, err := backend.Open(context.Background(), "mem://"+name+"/prefix")
		require.NoError(t, err)
		t.Cleanup(func() {
			st.Close()
			mem.Reset(name)
		})
		return st
	}})
}

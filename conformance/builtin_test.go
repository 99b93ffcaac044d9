package conformance_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/conformance"
)

var memSeq atomic.Int64

func TestFilesystem(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "fs", NewStore: func(t *testing.T) *backend.Store {
		st, err := backend.Open(context.Background(), t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}})
}

func TestMemory(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "mem", NewStore: func(t *testing.T) *backend.Store {
		st, err := backend.Open(context.Background(), fmt.Sprintf("mem://conf-%d/prefix", memSeq.Add(1)))
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}})
}

package memstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/plugins/examples/memplugin/memstore"
)

// TestMain prints the in-process rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance runs the suite on the plugin's driver in process, a
// fresh store per case; plugins/host runs it again through the plugin
// process and the wire protocol.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{Name: "memstore (in process)", NewStore: func(t conformance.T) *backend.Store {
		st, err := backend.NewStore(memstore.New(), "mem://memstore", "p")
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}})
}

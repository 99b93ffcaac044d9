package gcs_test

import (
	"github.com/stretchr/testify/require"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// TestMain prints this backend's conformance rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance runs the whole suite against the GCS emulator that
// scripts/test-servers.sh started (fake-gcs-server), with a small chunk
// size so the large-object case goes through a resumable upload. After
// every storage case no upload marker (an open resumable session) may be
// left below the prefix.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		Name: "gcs (fake-gcs-server)",
		NewStore: func(t conformance.T) *backend.Store {
			return openStore(t, "chunk_size", "4MiB")
		},
		Leftovers: noUploadMarkers,
		Skip: map[string]string{
			"storage/wrong-crc32c-multipart": "fake-gcs-server does not check the CRC32C of resumable uploads (real GCS does)",
		},
	})
}

// noUploadMarkers fails when a resumable session is still recorded below
// st: every Put, cancelled or failed ones included, cancels its own.
func noUploadMarkers(t conformance.T, st *backend.Store) {
	t.Helper()
	require.Empty(t, storetest.Uploads(t, st), "resumable upload sessions left recorded")
}

package gcs_test

import (
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
)

// TestMain prints this backend's conformance rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance runs the whole suite against the GCS emulator that
// scripts/test-servers.sh started (fake-gcs-server), with a small chunk
// size so the large-object case goes through a resumable upload.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		Name: "gcs (fake-gcs-server)",
		NewStore: func(t conformance.T) *backend.Store {
			return openStore(t, "chunk_size", "4MiB")
		},
		Skip: map[string]string{
			"storage/wrong-crc32c-multipart": "fake-gcs-server does not check the CRC32C of resumable uploads (real GCS does)",
		},
	})
}

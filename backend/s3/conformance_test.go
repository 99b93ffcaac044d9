package s3_test

import (
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
)

// TestMain prints this backend's conformance rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance runs the whole suite against the S3 server that
// scripts/test-servers.sh started (versitygw), with parts forced small so
// the large-object case goes through multipart upload.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		Name: "s3 (versitygw)",
		NewStore: func(t conformance.T) *backend.Store {
			return openStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "4")
		},
	})
}

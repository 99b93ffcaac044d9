package s3_test

import (
	"os"
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
		Leftovers: noIncompleteUploads,
	})
}

// seaweedURLEnv names the S3 URL of the optional SeaweedFS server that
// `WITH_SEAWEEDFS=1 scripts/test-servers.sh start` starts (weed mini). It
// takes the same AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY as versitygw.
const seaweedURLEnv = "CKPTKIT_TEST_S3_SEAWEED_URL"

// seaweedDeviations are the cases SeaweedFS does not meet, with the reason
// (checked to be server behaviour, not the driver's). None with the version
// scripts/test-servers.sh pins (SEAWEEDFS_VER): every case passes.
var seaweedDeviations = map[string]string{}

// TestConformanceSeaweedFS runs the suite against SeaweedFS, a distributed
// store (master, volume server, filer, S3 gateway), with small parts like
// TestConformance. It is optional, also on CI: without the URL it skips.
func TestConformanceSeaweedFS(t *testing.T) {
	raw := os.Getenv(seaweedURLEnv)
	if raw == "" {
		t.Skip(seaweedURLEnv + ` is unset (optional); start SeaweedFS with: eval "$(WITH_SEAWEEDFS=1 scripts/test-servers.sh start)"`)
	}
	conformance.Run(t, conformance.Harness{
		Name: "s3 (seaweedfs)",
		NewStore: func(t conformance.T) *backend.Store {
			return openStoreAt(t, raw, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "4")
		},
		Skip:      seaweedDeviations,
		Leftovers: noIncompleteUploads,
	})
}

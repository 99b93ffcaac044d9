package s3_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		Skip: seaweedDeviations,
	})
}

var seaweedBucketOnce sync.Map // endpoint/bucket -> error

// openStoreAt is openStore for an explicit URL: a fresh random prefix below
// raw (plus params), emptied when the test ends.
func openStoreAt(t conformance.T, raw string, kv ...string) *backend.Store {
	t.Helper()
	ctx := context.Background()
	root, err := backend.Open(ctx, withParams(t, raw, kv...))
	require.NoError(t, err)
	drv := root.Driver().(*s3.Driver)
	errAny, _ := seaweedBucketOnce.LoadOrStore(drv.Options().Endpoint+"/"+drv.Bucket(), ensureBucket(ctx, drv))
	if errAny != nil {
		require.NoError(t, errAny.(error))
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	st, err := root.Sub("t-" + hex.EncodeToString(b[:]))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var keys []string
		_ = st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil })
		for _, k := range keys {
			assert.NoError(t, st.Delete(ctx, k))
		}
		_ = root.Close()
	})
	return st
}

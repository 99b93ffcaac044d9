package main

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// The remote load's baseline really is a checked read: the SDK reads an
// object ckptkit stored (with its CRC32C) whole and checks it, and an S3
// object stored without a CRC32C fails the baseline instead of being read
// unchecked (the baseline used to be minio-go's unchecked GetObject while
// the GCS client checked, so the two figures compared different work).
func TestCheckedBaselineChecks(t *testing.T) {
	for _, tc := range []struct{ label, env string }{
		{"s3", ckpttest.S3URLEnv},
		{"gcs", ckpttest.GCSURLEnv},
	} {
		t.Run(tc.label, func(t *testing.T) {
			ctx := context.Background()
			u, err := url.Parse(storetest.TestURL(t, tc.env))
			require.NoError(t, err)
			raw, prefix, err := newRawClient(ctx, u)
			require.NoError(t, err)
			dir := fmt.Sprintf("checked-%d-%d", os.Getpid(), time.Now().UnixNano())
			st := storetest.Open(t, subURL(u, dir))
			t.Cleanup(func() { clearPrefix(context.Background(), st) })
			key := func(name string) string { return strings.TrimPrefix(prefix+"/"+dir+"/"+name, "/") }

			data := make([]byte, 3<<20+17)
			fillRandom(data, 7)
			crc := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
			require.NoError(t, st.PutBytes(ctx, "stored", data, backend.PutOptions{CRC32C: &crc}))
			got := make([]byte, len(data))
			require.NoError(t, raw.getChecked(ctx, key("stored"), got))
			require.True(t, bytes.Equal(data, got), "bytes read by the checked baseline")

			// A destination shorter than the object is not a whole read.
			require.Error(t, raw.getChecked(ctx, key("stored"), got[:len(got)-1]))

			if tc.label == "s3" {
				// minio-go's PutObject without a checksum option stores no
				// CRC32C: the checked baseline refuses to read it unchecked.
				require.NoError(t, raw.put(ctx, key("plain"), data))
				err := raw.getChecked(ctx, key("plain"), got)
				require.ErrorContains(t, err, "no full-object CRC32C")
				require.NoError(t, raw.del(ctx, key("plain")))
			}
		})
	}
}

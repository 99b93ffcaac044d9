// Package storetest holds the harness plumbing shared by the conformance
// tests of the object store drivers (backend/s3, backend/gcs): finding the
// test server's URL, adding URL parameters, and scratch prefixes that clean
// up after themselves. It defines no storage semantics: those are the
// conformance package's alone. Only tests import it.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
)

// TestURL returns the URL of the test server named by the environment
// variable env, or skips the test (fails it on CI) when it is unset, that
// is when the test servers are not running.
func TestURL(t conformance.T, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		msg := env + ` is unset; start the test servers with: eval "$(scripts/test-servers.sh start)"`
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s", msg)
		}
		t.Skip(msg)
	}
	return u
}

// Open opens the store at raw and closes it when the test ends.
func Open(t conformance.T, raw string) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), raw)
	require.NoError(t, err, "open %s", backend.RedactURL(raw))
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// WithParams returns raw with the query parameters kv (name, value, name,
// value, ...) set.
func WithParams(t conformance.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Scratch returns a Store for a fresh random prefix below root. When the
// test ends it deletes every object below that prefix and closes root.
func Scratch(t conformance.T, root *backend.Store) *backend.Store {
	t.Helper()
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
			assert.NoError(t, st.Delete(ctx, k), "clean up %s", st.URL(k))
		}
		_ = root.Close()
	})
	return st
}

// Uploads lists the incomplete uploads (S3 multipart uploads, GCS
// resumable sessions recorded by their markers) under st.
func Uploads(t conformance.T, st *backend.Store) []backend.Upload {
	t.Helper()
	out := []backend.Upload{}
	require.NoError(t, st.ListUploads(context.Background(), "", func(u backend.Upload) error {
		out = append(out, u)
		return nil
	}))
	return out
}

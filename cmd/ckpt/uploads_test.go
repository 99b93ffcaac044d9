package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/ckpttest"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/s3"
)

// uploads lists the incomplete uploads under st.
func uploads(t *testing.T, st *backend.Store) []backend.Upload {
	t.Helper()
	var out []backend.Upload
	require.NoError(t, st.ListUploads(context.Background(), "", func(u backend.Upload) error { out = append(out, u); return nil }))
	return out
}

// Regression (issue 16): a save or copy killed mid-upload left multipart
// uploads (52 in one campaign, 1.5 GB of parts) that nothing listed or
// aborted. ckpt gc lists them (--dry-run) and aborts those older than
// --grace; younger ones, which a running save may still complete, stay.
func TestGCAbortsAbandonedUploads(t *testing.T) {
	run := cloudURL(t, "CKPTKIT_TEST_S3_URL")
	trainJSON(t, "--url", run, "--steps", "2", "--save-every", "2")
	ctx := context.Background()
	st, err := backend.Open(ctx, run)
	require.NoError(t, err)
	defer st.Close()
	// What a SIGKILL during a multipart save leaves: a started upload with
	// a part, never completed.
	d := st.Driver().(*s3.Driver)
	core := minio.Core{Client: d.Client()}
	key := st.Prefix() + "step-00000004/rank-00000-000.0123456789abcdef.data"
	id, err := core.NewMultipartUpload(ctx, d.Bucket(), key, minio.PutObjectOptions{})
	require.NoError(t, err)
	part := bytes.Repeat([]byte("x"), 5<<20)
	_, err = core.PutObjectPart(ctx, d.Bucket(), key, id, 1, bytes.NewReader(part), int64(len(part)), minio.PutObjectPartOptions{})
	require.NoError(t, err)
	require.Len(t, uploads(t, st), 1)

	code, out, errs := ckpt(t, "gc", run, "--keep-last", "1", "--grace", "1h")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "incomplete", "younger than the grace period: kept")
	require.Len(t, uploads(t, st), 1)

	code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s", "--dry-run")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "upload step-00000004/rank-00000-000.0123456789abcdef.data")
	require.Contains(t, out, "would abort 1 incomplete upload(s)")
	require.Len(t, uploads(t, st), 1)

	code, out, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "aborted 1 incomplete upload(s)")
	require.Empty(t, uploads(t, st))
	code, vout, errs := ckpt(t, "verify", "--deep", ckpttest.WithPath(run, "step-00000002"))
	require.Equal(t, 0, code, "the committed checkpoint is untouched: %s%s", vout, errs)
}

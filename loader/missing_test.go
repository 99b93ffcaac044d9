package loader_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/loader"
)

// Regression (review of the reliability campaign): a read whose connection
// was cut in transit ends in io.ErrUnexpectedEOF like a truncated object,
// and was reported as a missing object (a bad checkpoint) once the Store's
// retries gave up. It stays transient; a truncated object and a missing one
// are still missing objects.
func TestMissingObjectKeepsCutConnectionsTransient(t *testing.T) {
	cut := &backend.Error{Op: "read", URL: "s3://b/ck/rank-0.data", Code: backend.CodeTransient,
		Err: fmt.Errorf("connection ended after 24 of 48 announced bytes: %w", io.ErrUnexpectedEOF)}
	err := loader.MissingObject(cut)
	require.False(t, errors.Is(err, loader.ErrMissingObject), "%v", err)
	require.Equal(t, ckpterr.Transient, ckpterr.ClassOf(err))

	short := &backend.Error{Op: "read", URL: "s3://b/ck/rank-0.data", Code: backend.CodeUnknown,
		Err: fmt.Errorf("object shorter than range [0,48): %w", io.ErrUnexpectedEOF)}
	require.ErrorIs(t, loader.MissingObject(short), loader.ErrMissingObject)
	gone := &backend.Error{Op: "read", URL: "s3://b/ck/rank-0.data", Code: backend.CodeNotFound, Err: errors.New("NoSuchKey")}
	err = loader.MissingObject(gone)
	require.ErrorIs(t, err, loader.ErrMissingObject)
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	require.Contains(t, err.Error(), "s3://b/ck/rank-0.data")
}

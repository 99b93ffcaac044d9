package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Upload is an incomplete multipart (S3) or resumable upload: parts stored
// and billed but never completed into an object.
type Upload struct {
	// Key is the object key the upload would create (relative to the
	// Store that listed it).
	Key string
	// ID identifies the upload to AbortUpload.
	ID string
	// Initiated is when the upload was started (zero when unknown).
	Initiated time.Time
	// Size is the bytes of parts stored so far (0 when unknown).
	Size int64
}

// UploadLister is implemented by drivers whose incomplete uploads can be
// listed and aborted: S3 lists its multipart uploads; GCS, which cannot
// list resumable sessions, lists the session markers its driver records
// (backend/gcs MarkerDir). Keys are full driver keys, as in Driver.
type UploadLister interface {
	// ListUploads calls fn for every incomplete upload of a key under
	// prefix.
	ListUploads(ctx context.Context, prefix string, fn func(Upload) error) error
	// AbortUpload aborts one upload and frees its parts. Aborting an
	// upload that is gone is not an error.
	AbortUpload(ctx context.Context, key, id string) error
}

// ListUploads lists the incomplete uploads of keys under prefix (relative
// to the store). A driver that cannot list them (or has none: mem publishes
// by swapping a map entry) gives ErrUnsupported. The fs driver lists the
// temporary files of killed writers.
func (s *Store) ListUploads(ctx context.Context, prefix string, fn func(Upload) error) error {
	ul, ok := s.drv.(UploadLister)
	if !ok {
		return &Error{Op: "list uploads", URL: s.URL(prefix), Code: CodeUnsupported, Err: fmt.Errorf("the backend cannot list incomplete uploads: %w", ErrUnsupported)}
	}
	p, err := cleanListPrefix(prefix)
	if err != nil {
		return &Error{Op: "list uploads", URL: s.URL(prefix), Code: CodeInvalidKey, Err: err}
	}
	// Not retried: entries may have been delivered before a failure.
	ctx = ContextWithStallTimeout(ctx, s.stall)
	var fnErr error
	err = ul.ListUploads(ctx, s.prefix+p, func(u Upload) error {
		u.Key = strings.TrimPrefix(u.Key, s.prefix)
		fnErr = fn(u)
		return fnErr
	})
	if err != nil && fnErr != nil && errors.Is(err, fnErr) {
		return fnErr
	}
	return s.wrap(ctx, "list uploads", prefix, err)
}

// AbortUpload aborts the incomplete upload id of key (relative to the
// store), as ListUploads reported it.
func (s *Store) AbortUpload(ctx context.Context, key, id string) error {
	ul, ok := s.drv.(UploadLister)
	if !ok {
		return &Error{Op: "abort upload", URL: s.URL(key), Code: CodeUnsupported, Err: ErrUnsupported}
	}
	full, err := s.full(key)
	if err != nil {
		return err
	}
	return s.retryLoop(ctx, func(ctx context.Context) error {
		return s.wrap(ctx, "abort upload", key, ul.AbortUpload(ctx, full, id))
	})
}

package gc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ckptkit/ckptkit/backend"
)

// FindUploads lists the incomplete uploads under run (S3 multipart
// uploads, GCS resumable sessions recorded by their markers) that were
// started longer than grace before now: the parts of saves and copies
// that were killed before they could abort their own uploads. Uploads of
// unknown age are left alone. On a file system, the temporary files of
// killed writers are the incomplete uploads (their age is that of their
// last write). Backends that have no incomplete uploads (mem) give none.
func FindUploads(ctx context.Context, run *backend.Store, grace time.Duration, now time.Time) ([]backend.Upload, error) {
	out := []backend.Upload{}
	err := run.ListUploads(ctx, "", func(u backend.Upload) error {
		if !u.Initiated.IsZero() && now.Sub(u.Initiated) >= grace {
			out = append(out, u)
		}
		return nil
	})
	if errors.Is(err, backend.ErrUnsupported) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gc %s: %w", run, err)
	}
	return out, nil
}

// AbortUploads aborts the uploads FindUploads returned and reports how
// many it aborted.
func AbortUploads(ctx context.Context, run *backend.Store, uploads []backend.Upload) (int, error) {
	n := 0
	for _, u := range uploads {
		if err := run.AbortUpload(ctx, u.Key, u.ID); err != nil {
			return n, fmt.Errorf("gc %s: %w", run, err)
		}
		n++
	}
	return n, nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/loader"
)

// errWouldReplace is the error of a command that would replace data
// without --force (exit 6, conflict).
var errWouldReplace = ckpterr.New(ckpterr.Conflict, "would replace existing data")

// refuseReplace returns an errWouldReplace naming what, the data at url
// that the command would replace, and how to go ahead.
func refuseReplace(url, what string) error {
	return fmt.Errorf("%s: %w: %s (pass --%s to replace it)", url, errWouldReplace, what, forceFlag)
}

// committedAt reports whether dst holds a committed checkpoint of any
// format the loader reads.
func committedAt(ctx context.Context, dst *backend.Store) (bool, error) {
	_, err := loader.Open(ctx, dst)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, loader.ErrNoCheckpoint), errors.Is(err, loader.ErrIncomplete), ckpterr.ClassOf(err) == ckpterr.NotFound:
		return false, nil
	case ckpterr.ClassOf(err) == ckpterr.BadCheckpoint, ckpterr.ClassOf(err) == ckpterr.Unsupported:
		// A committed-looking but unreadable checkpoint is data too.
		return true, nil
	}
	return false, err
}

// safetensorsAt returns the safetensors files (and index) directly under
// dst.
func safetensorsAt(ctx context.Context, dst *backend.Store) ([]string, error) {
	var names []string
	err := dst.ListDelimited(ctx, "", func(o backend.ObjectInfo) error {
		if !o.IsPrefix && (o.Key == safetensors.IndexFile || strings.HasSuffix(o.Key, ".safetensors")) {
			names = append(names, o.Key)
		}
		return nil
	})
	return names, err
}

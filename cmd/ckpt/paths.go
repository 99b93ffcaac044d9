package main

import (
	"context"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// errNoSuchPath is the error of a command given a URL under which nothing
// is stored: a typo'd path, not a bad checkpoint (exit 3).
var errNoSuchPath = ckpterr.New(ckpterr.NotFound, "no such path")

// pathError is errNoSuchPath for one URL.
type pathError struct{ url string }

func (e *pathError) Error() string {
	return fmt.Sprintf("no such path: %s (nothing is stored under it; check the URL)", e.url)
}
func (e *pathError) Unwrap() error { return errNoSuchPath }

// requirePath returns a *pathError (class not-found) when nothing at all is
// stored under st's prefix, nil when something is, and the storage error
// when it cannot tell.
func requirePath(ctx context.Context, st *backend.Store) error {
	empty, err := catalog.IsEmpty(ctx, st)
	switch {
	case err != nil && ckpterr.ClassOf(err) == ckpterr.NotFound:
		return &pathError{url: st.String()}
	case err != nil:
		return err
	case empty:
		return &pathError{url: st.String()}
	}
	return nil
}

// orNoSuchPath is what a command that found nothing to work on under st
// returns: a *pathError when nothing at all is stored there, else err (a
// storage error of the check wins over err). Commands call it only after
// finding nothing, so the happy path costs no extra request.
func orNoSuchPath(ctx context.Context, st *backend.Store, err error) error {
	if perr := requirePath(ctx, st); perr != nil {
		return perr
	}
	return err
}

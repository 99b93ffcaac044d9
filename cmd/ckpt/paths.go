package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
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

// errStopListing ends a listing early.
var errStopListing = errors.New("stop listing")

// requirePath returns a *pathError (class not-found) when nothing at all is
// stored under st's prefix, nil when something is, and the storage error
// when it cannot tell.
func requirePath(ctx context.Context, st *backend.Store) error {
	found := false
	err := st.ListDelimited(ctx, "", func(backend.ObjectInfo) error {
		found = true
		return errStopListing
	})
	if err != nil && !errors.Is(err, errStopListing) {
		if ckpterr.ClassOf(err) == ckpterr.NotFound {
			return &pathError{url: st.String()}
		}
		return err
	}
	if !found {
		return &pathError{url: st.String()}
	}
	return nil
}

// openExisting opens rawURL and checks that something is stored under it.
func openExisting(ctx context.Context, rawURL string) (*backend.Store, error) {
	st, err := openStore(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if err := requirePath(ctx, st); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

package gc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/loader"
)

// Orphan is a data object under a committed checkpoint that its metadata
// does not name: the objects of a save attempt that lost the commit to a
// concurrent writer, or of the attempt an overwrite replaced.
type Orphan struct {
	Checkpoint string
	Key        string // relative to the run
	Bytes      int64
	ModTime    time.Time
}

// FindOrphans returns the orphans under the committed native checkpoints
// of entries (as catalog.ListDetailed returns them) that are older than
// grace at now. Only prefixes holding objects of more than one save
// attempt are opened (their metadata is read once); checkpoints whose
// metadata cannot be read are left alone, for inspection. Entries in skip
// (checkpoints about to be deleted whole) are not examined.
func FindOrphans(ctx context.Context, run *backend.Store, entries []catalog.Entry, skip map[string]bool, grace time.Duration, now time.Time) ([]Orphan, error) {
	out := []Orphan{}
	for _, e := range entries {
		if skip[e.Name] || !e.Committed || !catalog.WrittenFormat(e.Format) || e.Attempts < 2 || e.ForeignObjects > 0 {
			continue
		}
		st, err := run.Sub(e.Name)
		if err != nil {
			return nil, err
		}
		c, err := loader.Open(ctx, st)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil, err
			}
			continue // unreadable: kept for inspection
		}
		named := map[string]bool{}
		for _, o := range c.Metadata().Objects {
			named[o.Key] = true
		}
		err = st.List(ctx, "", func(o backend.ObjectInfo) error {
			if named[o.Key] || catalog.IsMetadataObject(o.Key) || !catalog.OwnedObject(o.Key) {
				return nil
			}
			if o.ModTime.IsZero() || now.Sub(o.ModTime) < grace {
				return nil // a save may still be writing it
			}
			out = append(out, Orphan{Checkpoint: e.Name, Key: e.Name + "/" + o.Key, Bytes: o.Size, ModTime: o.ModTime})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("gc %s: %w", st, err)
		}
	}
	return out, nil
}

// DeleteOrphans deletes the orphans below run, concurrently (opts.Concurrency),
// and returns how many it deleted and their bytes. Each key is checked to
// be a data object name ckptkit writes, never the metadata object.
func DeleteOrphans(ctx context.Context, run *backend.Store, orphans []Orphan, opts Options) (int, int64, error) {
	conc := opts.Concurrency
	if conc <= 0 {
		conc = 8
	}
	var n, size atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	// Every key is checked before the first delete starts, so a refusal
	// never leaves deletes running unwatched.
	for _, o := range orphans {
		rel := strings.TrimPrefix(o.Key, o.Checkpoint+"/")
		if rel == o.Key || catalog.IsMetadataObject(rel) || !catalog.OwnedObject(rel) {
			return 0, 0, fmt.Errorf("%w: %s is not an orphan data object", ErrPolicy, run.URL(o.Key))
		}
	}
	for _, o := range orphans {
		g.Go(func() error {
			if err := run.Delete(gctx, o.Key); err != nil {
				return fmt.Errorf("gc %s: delete orphan: %w", run, err)
			}
			n.Add(1)
			size.Add(o.Bytes)
			return nil
		})
	}
	err := g.Wait()
	return int(n.Load()), size.Load(), err
}

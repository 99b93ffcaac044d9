package gc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/progress"
)

// Plan is the outcome of planning a collection: the run's checkpoints with
// a decision each, and the newest valid checkpoint that anchors the policy.
type Plan struct {
	Run string
	// NewestValid names the newest committed checkpoint that passes
	// verification ("" when none does).
	NewestValid string
	Decisions   []Decision
	// Deletions and DeleteBytes total the checkpoints to delete.
	Deletions   int
	DeleteBytes int64
	// Orphans are data objects under kept committed checkpoints that their
	// metadata does not name and that are older than the grace period
	// (FindOrphans); DeleteOrphans removes them.
	Orphans     []Orphan
	OrphanBytes int64
	// Uploads are incomplete multipart or resumable uploads under the run started
	// longer than the grace period ago (FindUploads); AbortUploads
	// aborts them.
	Uploads []backend.Upload
}

// PlanRun lists run once, finds its newest valid checkpoint (verified as
// catalog.Latest does, deep when asked) and applies p at time now.
func PlanRun(ctx context.Context, run *backend.Store, p Policy, deep bool, now time.Time) (*Plan, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	entries, err := catalog.ListDetailed(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("gc %s: %w", run, err)
	}
	newest := ""
	e, _, err := catalog.LatestIn(ctx, run, entries, deep)
	switch {
	case err == nil:
		newest = e.Name
	case !errors.Is(err, catalog.ErrNoCommittedCheckpoint):
		return nil, fmt.Errorf("gc %s: %w", run, err)
	}
	ds, err := Decide(entries, newest, p, now)
	if err != nil {
		return nil, err
	}
	pl := &Plan{Run: run.String(), NewestValid: newest, Decisions: ds}
	doomed := map[string]bool{}
	for _, d := range ds {
		if d.Delete {
			pl.Deletions++
			pl.DeleteBytes += d.Entry.Bytes
			doomed[d.Entry.Name] = true
		}
	}
	if pl.Orphans, err = FindOrphans(ctx, run, entries, doomed, p.Grace, now); err != nil {
		return nil, err
	}
	for _, o := range pl.Orphans {
		pl.OrphanBytes += o.Bytes
	}
	if pl.Uploads, err = FindUploads(ctx, run, p.Grace, now); err != nil {
		return nil, err
	}
	return pl, nil
}

// Options tune Execute.
type Options struct {
	// Concurrency bounds parallel object deletions (default 8).
	Concurrency int
	// Progress, when set, is called after each checkpoint is handled:
	// Done and Total count the checkpoints to delete (Unit
	// progress.Checkpoints), Item is the checkpoint's name, Objects and
	// Bytes what deleting it freed; Skipped is non-empty when it changed
	// since planning and was left alone.
	Progress progress.Func
}

// Deleted is one checkpoint removed by Execute.
type Deleted struct {
	Name    string
	Step    int64
	Objects int
	Bytes   int64
}

// Result is what Execute did.
type Result struct {
	Deleted []Deleted
	// Skipped are doomed checkpoints left alone because they changed
	// between planning and deletion (a writer touched them).
	Skipped        []Decision
	ObjectsDeleted int
	BytesFreed     int64
	// OrphansDeleted and OrphanBytesFreed count the orphan data objects
	// DeleteOrphans removed (the CLI runs it after Execute).
	OrphansDeleted   int
	OrphanBytesFreed int64
	// UploadsAborted counts the incomplete uploads AbortUploads aborted.
	UploadsAborted int
}

// Execute deletes the checkpoints the decisions mark, oldest first, below
// run. For each, it lists the prefix again and leaves it alone if it
// changed since planning; otherwise it deletes the metadata object first,
// then the data objects in parallel. On error or cancellation it stops and
// returns what it did so far with the error; every checkpoint it touched
// is then uncommitted, never committed with missing data.
func Execute(ctx context.Context, run *backend.Store, decisions []Decision, opts Options) (*Result, error) {
	conc := opts.Concurrency
	if conc <= 0 {
		conc = 8
	}
	var doomed []Decision
	for _, d := range decisions {
		if d.Delete {
			doomed = append(doomed, d)
		}
	}
	sort.Slice(doomed, func(i, j int) bool { return doomed[i].Entry.Step < doomed[j].Entry.Step })
	res := &Result{Deleted: []Deleted{}, Skipped: []Decision{}}
	for i, d := range doomed {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("gc %s: %w", run, err)
		}
		del, skip, err := deleteOne(ctx, run, d.Entry, conc)
		if del != nil {
			res.Deleted = append(res.Deleted, *del)
			res.ObjectsDeleted += del.Objects
			res.BytesFreed += del.Bytes
		}
		if err != nil {
			return res, fmt.Errorf("gc %s: %w", run, err)
		}
		p := progress.Update{Done: int64(i + 1), Total: int64(len(doomed)), Unit: progress.Checkpoints, Item: d.Entry.Name}
		if skip != "" {
			d.Reason = skip
			d.Delete = false
			res.Skipped = append(res.Skipped, d)
			p.Skipped = skip
		} else {
			p.Objects, p.Bytes = del.Objects, del.Bytes
		}
		opts.Progress.Report(p)
	}
	return res, nil
}

func deleteOne(ctx context.Context, run *backend.Store, e catalog.Entry, conc int) (*Deleted, string, error) {
	st, err := run.Sub(e.Name)
	if err != nil {
		return nil, "", err
	}
	var objs []backend.ObjectInfo
	var size int64
	var newest time.Time
	if err := st.List(ctx, "", func(o backend.ObjectInfo) error {
		objs = append(objs, o)
		size += o.Size
		if o.ModTime.After(newest) {
			newest = o.ModTime
		}
		return nil
	}); err != nil {
		return nil, "", err
	}
	var meta, data []string
	for _, o := range objs {
		if !catalog.OwnedObject(o.Key) {
			return nil, fmt.Sprintf("changed since planning: now holds %s, which ckptkit did not write", st.URL(o.Key)), nil
		}
		if catalog.IsMetadataObject(o.Key) {
			meta = append(meta, o.Key)
		} else {
			data = append(data, o.Key)
		}
	}
	if len(objs) != e.Objects || size != e.Bytes || !newest.Equal(e.ModTime) || (len(meta) > 0) != e.Committed {
		return nil, fmt.Sprintf("changed since planning (%d objects, %d bytes now; %d, %d planned)", len(objs), size, e.Objects, e.Bytes), nil
	}
	del := &Deleted{Name: e.Name, Step: e.Step}
	// The commit point goes first: from here on the prefix is uncommitted.
	for _, k := range meta {
		if err := st.Delete(ctx, k); err != nil {
			return nil, "", err
		}
		del.Objects++
	}
	var n atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for _, k := range data {
		g.Go(func() error {
			if err := st.Delete(gctx, k); err != nil {
				return err
			}
			n.Add(1)
			return nil
		})
	}
	err = g.Wait()
	del.Objects += int(n.Load())
	if err == nil {
		del.Bytes = size
	}
	return del, "", err
}

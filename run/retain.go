package run

import (
	"context"
	"time"

	"github.com/ckptkit/ckptkit/ops/gc"
)

// PlanRetention lists the run once and decides, with policy p at time now,
// which checkpoints to delete (the newest valid one, verified deeply with
// deep, is never among them), which orphan data objects and which
// incomplete uploads older than p.Grace to remove (gc.PlanRun).
func (r *Run) PlanRetention(ctx context.Context, p gc.Policy, deep bool, now time.Time) (*gc.Plan, error) {
	return gc.PlanRun(ctx, r.st, p, deep, now)
}

// Collect carries out plan, the whole sequence: it deletes the doomed
// checkpoints (metadata first, so none is left committed with missing
// data; one that changed since planning is left alone), then the orphan
// data objects, then aborts the incomplete uploads. It stops at the first
// error and returns what it did so far with it.
func (r *Run) Collect(ctx context.Context, plan *gc.Plan, opts gc.Options) (*gc.Result, error) {
	res, err := gc.Execute(ctx, r.st, plan.Decisions, opts)
	if err == nil && len(plan.Orphans) > 0 {
		res.OrphansDeleted, res.OrphanBytesFreed, err = gc.DeleteOrphans(ctx, r.st, plan.Orphans, opts)
	}
	if err == nil && len(plan.Uploads) > 0 {
		res.UploadsAborted, err = gc.AbortUploads(ctx, r.st, plan.Uploads)
	}
	return res, err
}

// Retain applies retention policy p to the run now: PlanRetention, then
// Collect. It returns the plan and what was done.
func (r *Run) Retain(ctx context.Context, p gc.Policy, opts gc.Options) (*gc.Plan, *gc.Result, error) {
	plan, err := r.PlanRetention(ctx, p, false, time.Now())
	if err != nil {
		return nil, nil, err
	}
	res, err := r.Collect(ctx, plan, opts)
	return plan, res, err
}

package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/ops/gc"
	prog "github.com/ckptkit/ckptkit/progress"
	ckrun "github.com/ckptkit/ckptkit/run"
)

// gcOutput is the --json document of ckpt gc.
type gcOutput struct {
	header
	URL         string       `json:"url"`
	DryRun      bool         `json:"dry_run"`
	NewestValid string       `json:"newest_valid"`
	Decisions   []gcDecision `json:"decisions"`
	// Deletions and Bytes total the checkpoints the plan deletes.
	Deletions int   `json:"deletions"`
	Bytes     int64 `json:"bytes"`
	// Orphans are data objects of kept checkpoints their metadata does not
	// name (older than --grace), OrphanBytes their total; Uploads the
	// incomplete multipart uploads older than --grace.
	Orphans     []gcOrphan `json:"orphans"`
	OrphanBytes int64      `json:"orphan_bytes"`
	Uploads     []gcUpload `json:"uploads"`
	// Result is what the deletion did (absent with --dry-run).
	Result *gcResult `json:"result,omitempty"`
}

type gcDecision struct {
	Checkpoint checkpointJSON `json:"checkpoint"`
	Delete     bool           `json:"delete"`
	Reason     string         `json:"reason"`
}

type gcResult struct {
	Deleted        []gcDeleted  `json:"deleted"`
	Skipped        []gcDecision `json:"skipped"`
	Objects        int          `json:"objects"`
	Bytes          int64        `json:"bytes"`
	Orphans        int          `json:"orphans"`
	OrphanBytes    int64        `json:"orphan_bytes"`
	UploadsAborted int          `json:"uploads_aborted"`
}

// gcDeleted is a checkpoint gc removed (a gc.Deleted).
type gcDeleted struct {
	Name    string `json:"name"`
	Step    int64  `json:"step"`
	Objects int    `json:"objects"`
	Bytes   int64  `json:"bytes"`
}

type gcOrphan struct {
	Checkpoint string     `json:"checkpoint"`
	Key        string     `json:"key"`
	Bytes      int64      `json:"bytes"`
	Modified   *time.Time `json:"modified,omitempty"`
}

type gcUpload struct {
	Key       string     `json:"key"`
	ID        string     `json:"id"`
	Initiated *time.Time `json:"initiated,omitempty"`
	Bytes     int64      `json:"bytes"`
}

// orZero is t in UTC, nil when t is zero (unknown).
func orZero(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// gcPlanJSON is the document of a plan (Result is added after Execute).
func gcPlanJSON(plan *gc.Plan, dryRun bool) *gcOutput {
	out := &gcOutput{URL: plan.Run, DryRun: dryRun, NewestValid: plan.NewestValid, Decisions: gcDecisions(plan.Decisions),
		Deletions: plan.Deletions, Bytes: plan.DeleteBytes, Orphans: []gcOrphan{}, OrphanBytes: plan.OrphanBytes, Uploads: []gcUpload{}}
	for _, o := range plan.Orphans {
		out.Orphans = append(out.Orphans, gcOrphan{Checkpoint: o.Checkpoint, Key: o.Key, Bytes: o.Bytes, Modified: orZero(o.ModTime)})
	}
	for _, u := range plan.Uploads {
		out.Uploads = append(out.Uploads, gcUpload{Key: u.Key, ID: u.ID, Initiated: orZero(u.Initiated), Bytes: u.Size})
	}
	return out
}

func gcDecisions(ds []gc.Decision) []gcDecision {
	out := make([]gcDecision, 0, len(ds))
	for _, d := range ds {
		out = append(out, gcDecision{Checkpoint: entryJSON(d.Entry), Delete: d.Delete, Reason: d.Reason})
	}
	return out
}

func gcResultJSON(r *gc.Result) *gcResult {
	if r == nil {
		return nil
	}
	out := &gcResult{Deleted: make([]gcDeleted, 0, len(r.Deleted)), Skipped: gcDecisions(r.Skipped), Objects: r.ObjectsDeleted, Bytes: r.BytesFreed,
		Orphans: r.OrphansDeleted, OrphanBytes: r.OrphanBytesFreed, UploadsAborted: r.UploadsAborted}
	for _, d := range r.Deleted {
		out.Deleted = append(out.Deleted, gcDeleted{Name: d.Name, Step: d.Step, Objects: d.Objects, Bytes: d.Bytes})
	}
	return out
}

func newGCCmd() *cobra.Command {
	var (
		asJSON, dryRun, deep bool
		keepLast, parallel   int
		keepEvery            int64
		olderThan, grace     string
	)
	cmd := &cobra.Command{
		Use:   "gc RUN_URL --keep-last N",
		Short: "Delete the checkpoints of a run that a retention policy does not keep",
		Long: `Deletes step-NNNNNNNN checkpoints under RUN_URL that the policy does not keep.
A committed checkpoint older than the newest valid one is kept when it is
among the --keep-last N newest committed ones (counting down from the newest
valid one), when its step is a multiple of --keep-every K, or when it is
younger than --older-than D.

Never deleted: the newest valid checkpoint (the one "ckpt latest" prints);
anything newer than it that is younger than --grace (a save may be writing
it; older ones that fail verification are kept for inspection); uncommitted
prefixes younger than --grace; prefixes holding any object ckptkit did not
write (DCP checkpoints torch wrote itself are kept; those of
ckptkit.torch.save are expired like native ones). Uncommitted prefixes older than --grace
are abandoned saves and are removed. Under committed checkpoints, data
objects older than --grace that the metadata does not name (a save attempt
that lost the commit to a concurrent writer, or one an overwrite replaced)
are orphans and are removed too. Incomplete uploads under the run started
more than --grace ago (parts of a save or copy that was killed: S3 multipart
uploads, GCS resumable sessions recorded in .ckptkit-uploads/ markers, and
on a file system the .ckptkit-tmp-* files of killed writers, by the time of
their last write) are listed and aborted. A checkpoint storage refuses to
read (a directory this user may not read) is kept.

Each deletion removes the metadata object first, so an interrupted gc never
leaves a committed-looking checkpoint with missing data, then the data
objects in parallel. A prefix that changed since planning is left alone.
Durations accept Go syntax (90m, 36h) and days (7d).

Progress (checkpoints deleted / to delete, rate, ETA) is shown on a terminal.`,
		Example: `  ckpt gc ./runs/demo --keep-last 3 --dry-run
  ckpt gc s3://bucket/runs/demo --keep-last 5 --keep-every 1000 --older-than 7d
  ckpt gc gs://bucket/run --keep-last 2 --deep --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p := gc.Policy{KeepLast: keepLast, KeepEvery: keepEvery}
			var err error
			if p.OlderThan, err = parseDuration(olderThan); err != nil {
				return usage(fmt.Errorf("--older-than: %w", err))
			}
			if p.Grace, err = parseDuration(grace); err != nil {
				return usage(fmt.Errorf("--grace: %w", err))
			}
			run, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer run.Close()
			now := time.Now()
			r := ckrun.New(run)
			plan, err := r.PlanRetention(ctx, p, deep, now)
			if err != nil {
				return err
			}
			// A run holding nothing but abandoned uploads (a copy or save
			// killed before its first object landed) is not a missing path:
			// gc is what cleans it up.
			if len(plan.Decisions) == 0 && len(plan.Uploads) == 0 {
				if err := requirePath(ctx, run); err != nil {
					return err
				}
			}
			out := gcPlanJSON(plan, dryRun)
			if !asJSON {
				printGCPlan(cmd.OutOrStdout(), plan, now, dryRun)
			}
			if !dryRun && (plan.Deletions > 0 || len(plan.Orphans) > 0 || len(plan.Uploads) > 0) {
				opts := gc.Options{Concurrency: parallel}
				p := newItemProgress(cmd, "gc", "checkpoints")
				in := inv(cmd)
				opts.Progress = func(pr prog.Update) {
					defer p.update(pr.Done, pr.Total)
					if asJSON {
						return
					}
					if pr.Skipped != "" {
						in.notef("[%d/%d] kept %s: %s", pr.Done, pr.Total, safe(pr.Item), safe(pr.Skipped))
						return
					}
					in.notef("[%d/%d] deleted %s (%d objects, %s)", pr.Done, pr.Total, safe(pr.Item), pr.Objects, humanBytes(pr.Bytes))
				}
				res, err := r.Collect(ctx, plan, opts)
				p.finish()
				out.Result = gcResultJSON(res)
				if err != nil {
					if asJSON {
						emit(cmd, out)
					}
					return err
				}
				if !asJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "deleted %d checkpoint(s), %d objects, %s freed\n", len(res.Deleted), res.ObjectsDeleted, humanBytes(res.BytesFreed))
					if res.UploadsAborted > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "aborted %d incomplete upload(s)\n", res.UploadsAborted)
					}
					if res.OrphansDeleted > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "deleted %d orphan data object(s), %s freed\n", res.OrphansDeleted, humanBytes(res.OrphanBytesFreed))
					}
				}
			}
			if asJSON {
				emit(cmd, out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&keepLast, "keep-last", 0, "keep the N newest committed checkpoints up to the newest valid one (required, >= 1)")
	f.Int64Var(&keepEvery, "keep-every", 0, "also keep checkpoints whose step is a multiple of K")
	f.StringVar(&olderThan, "older-than", "0", "only delete checkpoints older than D (e.g. 7d)")
	f.StringVar(&grace, "grace", "1h", "protect uncommitted and newer-than-valid prefixes younger than D")
	f.BoolVar(&dryRun, "dry-run", false, "print the plan, delete nothing")
	f.BoolVar(&deep, "deep", false, "verify the newest valid checkpoint deeply (every checksum)")
	addParallelFlag(cmd, &parallel, "objects deleted at once")
	// --concurrency is the old name of --parallel.
	f.IntVar(&parallel, "concurrency", 8, "")
	_ = f.MarkDeprecated("concurrency", "use --parallel")
	f.BoolVar(&asJSON, "json", false, jsonHelp)
	_ = cmd.MarkFlagRequired("keep-last")
	return cmd
}

func printGCPlan(w io.Writer, plan *gc.Plan, now time.Time, dryRun bool) {
	valid := plan.NewestValid
	if valid == "" {
		valid = "none"
	}
	fmt.Fprintf(w, "run %s: newest valid checkpoint %s\n", safe(plan.Run), safe(valid))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tSTEP\tSTATE\tSIZE\tAGE\tREASON")
	for _, d := range plan.Decisions {
		action := "keep"
		if d.Delete {
			action = "DELETE"
		}
		state := "committed"
		if !d.Entry.Committed {
			state = "uncommitted"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", action, d.Entry.Step, state, humanBytes(d.Entry.Bytes), humanAge(d.Entry.Age(now)), safe(d.Reason))
	}
	tw.Flush()
	verb := "will delete"
	if dryRun {
		verb = "dry run: would delete"
	}
	fmt.Fprintf(w, "%s %d checkpoint(s), %s\n", verb, plan.Deletions, humanBytes(plan.DeleteBytes))
	for _, o := range plan.Orphans {
		fmt.Fprintf(w, "orphan %s (%s): not named by its checkpoint's metadata\n", safe(o.Key), humanBytes(o.Bytes))
	}
	if len(plan.Orphans) > 0 {
		fmt.Fprintf(w, "%s %d orphan data object(s) of losing or replaced save attempts, %s\n", verb, len(plan.Orphans), humanBytes(plan.OrphanBytes))
	}
	for _, u := range plan.Uploads {
		if u.Size == 0 { // unknown (GCS sessions) or no part yet
			fmt.Fprintf(w, "upload %s (started %s ago): incomplete\n", safe(u.Key), humanAge(now.Sub(u.Initiated)))
			continue
		}
		fmt.Fprintf(w, "upload %s (%s of parts, started %s ago): incomplete\n", safe(u.Key), humanBytes(u.Size), humanAge(now.Sub(u.Initiated)))
	}
	if len(plan.Uploads) > 0 {
		abort := "will abort"
		if dryRun {
			abort = "dry run: would abort"
		}
		fmt.Fprintf(w, "%s %d incomplete upload(s) older than the grace period\n", abort, len(plan.Uploads))
	}
}

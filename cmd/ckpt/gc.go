package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ops/gc"
)

type gcOutput struct {
	DryRun bool       `json:"dry_run"`
	Plan   *gc.Plan   `json:"plan"`
	Result *gc.Result `json:"result,omitempty"`
}

func newGCCmd() *cobra.Command {
	var (
		asJSON, dryRun, deep  bool
		keepLast, concurrency int
		keepEvery             int64
		olderThan, grace      string
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
write, including foreign formats. Uncommitted prefixes older than --grace
are abandoned saves and are removed. Under committed checkpoints, data
objects older than --grace that the metadata does not name (a save attempt
that lost the commit to a concurrent writer, or one an overwrite replaced)
are orphans and are removed too. Incomplete multipart uploads under the run
(S3) started more than --grace ago (parts of a save or copy that was killed)
are listed and aborted.

Each deletion removes the metadata object first, so an interrupted gc never
leaves a committed-looking checkpoint with missing data, then the data
objects in parallel. A prefix that changed since planning is left alone.
Durations accept Go syntax (90m, 36h) and days (7d).`,
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
			run, err := backend.Open(ctx, args[0])
			if err != nil {
				return err
			}
			defer run.Close()
			now := time.Now()
			plan, err := gc.PlanRun(ctx, run, p, deep, now)
			if err != nil {
				return err
			}
			out := gcOutput{DryRun: dryRun, Plan: plan}
			if !asJSON {
				printGCPlan(cmd.OutOrStdout(), plan, now, dryRun)
			}
			if !dryRun && (plan.Deletions > 0 || len(plan.Orphans) > 0 || len(plan.Uploads) > 0) {
				opts := gc.Options{Concurrency: concurrency}
				if !asJSON {
					opts.Progress = func(pr gc.Progress) {
						if pr.Skipped != "" {
							fmt.Fprintf(cmd.ErrOrStderr(), "[%d/%d] kept %s: %s\n", pr.Done, pr.Total, pr.Checkpoint, pr.Skipped)
							return
						}
						fmt.Fprintf(cmd.ErrOrStderr(), "[%d/%d] deleted %s (%d objects, %s)\n", pr.Done, pr.Total, pr.Checkpoint, pr.Objects, humanBytes(pr.Bytes))
					}
				}
				res, err := gc.Execute(ctx, run, plan.Decisions, opts)
				out.Result = res
				if err == nil && len(plan.Orphans) > 0 {
					res.OrphansDeleted, res.OrphanBytesFreed, err = gc.DeleteOrphans(ctx, run, plan.Orphans, opts)
				}
				if err == nil && len(plan.Uploads) > 0 {
					res.UploadsAborted, err = gc.AbortUploads(ctx, run, plan.Uploads)
				}
				if err != nil {
					if asJSON {
						_ = writeJSON(cmd.OutOrStdout(), out)
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
				return writeJSON(cmd.OutOrStdout(), out)
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
	f.IntVar(&concurrency, "concurrency", 8, "parallel object deletions")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("keep-last")
	return cmd
}

func printGCPlan(w io.Writer, plan *gc.Plan, now time.Time, dryRun bool) {
	valid := plan.NewestValid
	if valid == "" {
		valid = "none"
	}
	fmt.Fprintf(w, "run %s: newest valid checkpoint %s\n", plan.Run, valid)
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", action, d.Entry.Step, state, humanBytes(d.Entry.Bytes), humanAge(d.Entry.Age(now)), d.Reason)
	}
	tw.Flush()
	verb := "will delete"
	if dryRun {
		verb = "dry run: would delete"
	}
	fmt.Fprintf(w, "%s %d checkpoint(s), %s\n", verb, plan.Deletions, humanBytes(plan.DeleteBytes))
	for _, o := range plan.Orphans {
		fmt.Fprintf(w, "orphan %s (%s): not named by its checkpoint's metadata\n", o.Key, humanBytes(o.Bytes))
	}
	if len(plan.Orphans) > 0 {
		fmt.Fprintf(w, "%s %d orphan data object(s) of losing or replaced save attempts, %s\n", verb, len(plan.Orphans), humanBytes(plan.OrphanBytes))
	}
	for _, u := range plan.Uploads {
		fmt.Fprintf(w, "upload %s (%s of parts, started %s ago): incomplete\n", u.Key, humanBytes(u.Size), humanAge(now.Sub(u.Initiated)))
	}
	if len(plan.Uploads) > 0 {
		abort := "will abort"
		if dryRun {
			abort = "dry run: would abort"
		}
		fmt.Fprintf(w, "%s %d incomplete upload(s) older than the grace period\n", abort, len(plan.Uploads))
	}
}

// parseDuration accepts Go durations plus a whole number of days ("7d").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(d, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

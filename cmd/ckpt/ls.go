package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
)

// checkpointJSON is a checkpoint of a run in --json output (ls, gc).
type checkpointJSON struct {
	Name      string `json:"name"`
	Step      int64  `json:"step"`
	URL       string `json:"url"`
	Committed bool   `json:"committed"`
	Format    string `json:"format"`
	Objects   int    `json:"objects"`
	Bytes     int64  `json:"bytes"`
	// Modified is the time of the newest object (absent when the backend
	// gives none).
	Modified       *time.Time `json:"modified,omitempty"`
	ForeignObjects int        `json:"foreign_objects"`
	// Unreadable is why storage refused to read the checkpoint (absent
	// when it could).
	Unreadable string `json:"unreadable,omitempty"`
}

func entryJSON(e catalog.Entry) checkpointJSON {
	c := checkpointJSON{Name: e.Name, Step: e.Step, URL: e.URL, Committed: e.Committed, Format: e.Format, Objects: e.Objects, Bytes: e.Bytes, ForeignObjects: e.ForeignObjects, Unreadable: e.Unreadable}
	if !e.ModTime.IsZero() {
		t := e.ModTime.UTC()
		c.Modified = &t
	}
	return c
}

// lsOutput is the --json document of ckpt ls.
type lsOutput struct {
	header
	URL         string           `json:"url"`
	Checkpoints []checkpointJSON `json:"checkpoints"`
	// Uploads counts the incomplete uploads under the run (temporary
	// files of killed writers on a file system), absent where the
	// backend cannot list them.
	Uploads *uploadsJSON `json:"incomplete_uploads,omitempty"`
	// Local is the local tier's listing (--local).
	Local *lsTier `json:"local,omitempty"`
}

// lsTier is a local tier in ls --json.
type lsTier struct {
	URL         string           `json:"url"`
	Checkpoints []checkpointJSON `json:"checkpoints"`
}

type uploadsJSON struct {
	Count int   `json:"count"`
	Bytes int64 `json:"bytes"`
}

// countUploads totals the incomplete uploads under run; nil when the
// backend cannot list them.
func countUploads(cmd *cobra.Command, run *backend.Store) (*uploadsJSON, error) {
	u := &uploadsJSON{}
	err := run.ListUploads(cmd.Context(), "", func(up backend.Upload) error {
		u.Count++
		u.Bytes += up.Size
		return nil
	})
	if errors.Is(err, backend.ErrUnsupported) {
		return nil, nil
	}
	return u, err
}

func newLsCmd() *cobra.Command {
	var asJSON bool
	var localURL string
	cmd := &cobra.Command{
		Use:   "ls RUN_URL",
		Short: "List every checkpoint under a run: step, committed or not, size, age",
		Long: `Lists the step-NNNNNNNN prefixes under RUN_URL, oldest step first, with one
listing of the run: whether each is committed (and in which format), its
objects, total size, the age of its newest object, and how many objects
ckptkit did not write (gc never deletes such prefixes). A checkpoint storage
refuses to read (a directory this user may not read) is listed as
unreadable with the reason. The count and size of incomplete uploads under
the run follow (temporary files or parts of killed saves: gc removes them).
A RUN_URL under which nothing is stored exits 3 ("no such path").
--local LOCAL lists the run's local tier (ckpt train --local) after it.`,
		Example: `  ckpt ls ./runs/demo
  ckpt ls s3://bucket/runs/demo --local /dev/shm/demo
  ckpt ls s3://bucket/runs/demo --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			run, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer run.Close()
			es, err := catalog.ListDetailed(ctx, run)
			if err != nil {
				return err
			}
			ups, err := countUploads(cmd, run)
			if err != nil {
				return err
			}
			if len(es) == 0 && (ups == nil || ups.Count == 0) {
				if err := requirePath(ctx, run); err != nil {
					return err
				}
			}
			var local *backend.Store
			var les []catalog.Entry
			if localURL != "" {
				if local, err = openStore(ctx, localURL); err != nil {
					return err
				}
				defer local.Close()
				if les, err = catalog.ListDetailed(ctx, local); err != nil {
					return err
				}
			}
			if asJSON {
				out := &lsOutput{URL: run.String(), Checkpoints: entriesJSON(es), Uploads: ups}
				if local != nil {
					out.Local = &lsTier{URL: local.String(), Checkpoints: entriesJSON(les)}
				}
				emit(cmd, out)
				return nil
			}
			if local != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "durable tier %s:\n", safe(run.String()))
			}
			printLs(cmd.OutOrStdout(), run.String(), es, time.Now())
			if local != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "local tier %s:\n", safe(local.String()))
				printLs(cmd.OutOrStdout(), local.String(), les, time.Now())
			}
			if ups != nil && ups.Count > 0 {
				size := humanBytes(ups.Bytes)
				if ups.Bytes == 0 {
					size = "size not known" // S3 lists no part sizes, GCS sessions none
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d incomplete upload(s), %s: temporary files or parts of killed saves (`ckpt gc` removes those older than --grace)\n", ups.Count, size)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().StringVar(&localURL, "local", "", "also list the run's local tier (ckpt train --local; docs/TIERS.md)")
	return cmd
}

func entriesJSON(es []catalog.Entry) []checkpointJSON {
	out := []checkpointJSON{}
	for _, e := range es {
		out = append(out, entryJSON(e))
	}
	return out
}

func printLs(w io.Writer, run string, es []catalog.Entry, now time.Time) {
	if len(es) == 0 {
		fmt.Fprintf(w, "no checkpoints under %s\n", safe(run))
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tNAME\tSTATE\tFORMAT\tOBJECTS\tSIZE\tAGE\tNOTE")
	for _, e := range es {
		state := "committed"
		if !e.Committed {
			state = "uncommitted"
		}
		var note []string
		if e.Unreadable != "" {
			state = "unreadable"
			note = append(note, e.Unreadable)
		}
		if e.ForeignObjects > 0 {
			note = append(note, fmt.Sprintf("%d foreign object(s)", e.ForeignObjects))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Step, safe(e.Name), state, safe(orDash(e.Format)), e.Objects, humanBytes(e.Bytes), humanAge(e.Age(now)), strings.Join(note, ", "))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// humanBytes formats n with binary units ("1.5 MiB").
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// humanAge formats an age ("45s", "3m", "2h5m", "4d3h"); "?" when unknown.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "?"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/conformance"
)

// conformanceReport is the --json output of ckpt conformance.
type conformanceReport struct {
	header
	// URL is the storage URL as given, redacted; Prefix the run's prefix
	// below it.
	URL     string            `json:"url"`
	Prefix  string            `json:"prefix"`
	Backend string            `json:"backend"`
	Cases   []conformanceCase `json:"cases"`
	Seconds float64           `json:"seconds"`
	// Removed is how many objects the run left and then deleted.
	Removed int `json:"removed"`
}

type conformanceCase struct {
	Case    string  `json:"case"`
	Status  string  `json:"status"`
	Message string  `json:"message,omitempty"`
	Seconds float64 `json:"seconds"`
}

func newConformanceCmd() *cobra.Command {
	var asJSON, short, large bool
	var match string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "conformance URL",
		Short: "Run the backend conformance suite against a live storage URL (exit 0 all pass, 1 a case fails)",
		Long: `Runs the storage semantics and checkpoint cases of the conformance suite
(see docs/CONFORMANCE.md) against URL, inside a fresh prefix
URL/ckptkit-conformance-<random>/ that is listed and deleted afterwards.
Each case works in its own sub-prefix; storage cases run a second time
inside a random Sub prefix ("@prefix").

Prints a case x backend table (or JSON with --json). --short writes an
8 MiB large object instead of 24 MiB; --large writes 256 MiB. For backends
with multipart uploads, pass small parts in the URL (s3:
?part_size=5MiB&multipart_threshold=5MiB) so the large case crosses parts.
Exit 0 when every case passes or is skipped, 1 when one fails, 2 on usage
or access errors.`,
		Example: `  ckpt conformance --short mem://conf
  ckpt conformance "s3://bucket/scratch?endpoint=127.0.0.1:9000&insecure=true&path_style=true&part_size=5MiB&multipart_threshold=5MiB"
  ckpt conformance --run 'large|list' --json gs://bucket/scratch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var re *regexp.Regexp
			if match != "" {
				var err error
				if re, err = regexp.Compile(match); err != nil {
					return usage(fmt.Errorf("--run: %w", err))
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			u, err := backend.ParseURL(args[0])
			if err != nil {
				return err
			}
			st, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer st.Close()

			prefix := "ckptkit-conformance-" + randomHex(6)
			runRoot, err := st.Sub(prefix)
			if err != nil {
				return err
			}
			// Access check, so that missing permissions are a usage error
			// rather than 40 failed cases.
			if err := runRoot.PutBytes(ctx, "access-probe", []byte("probe"), backend.PutOptions{}); err != nil {
				return fmt.Errorf("cannot write to %s: %w", runRoot, err)
			}
			if err := runRoot.Delete(ctx, "access-probe"); err != nil {
				return fmt.Errorf("cannot delete from %s: %w", runRoot, err)
			}

			var seq atomic.Int64
			h := conformance.Harness{Name: u.Scheme, Large: large, NewStore: func(t conformance.T) *backend.Store {
				sub, err := runRoot.Sub(fmt.Sprintf("case-%03d", seq.Add(1)))
				if err != nil {
					t.Fatalf("sub store: %v", err)
				}
				return sub
			}}
			res := conformance.RunAll(ctx, h, conformance.Options{Short: short, Match: re, CaseTimeout: timeout})

			removed, cleanErr := purge(context.WithoutCancel(ctx), runRoot)
			out := cmd.OutOrStdout()
			if asJSON {
				rep := &conformanceReport{URL: backend.RedactURL(args[0]), Prefix: prefix, Backend: res.Backend, Cases: []conformanceCase{}, Seconds: res.Duration.Seconds(), Removed: removed}
				for _, c := range res.Cases {
					rep.Cases = append(rep.Cases, conformanceCase{Case: c.Case, Status: string(c.Status), Message: c.Message, Seconds: c.Duration.Seconds()})
				}
				emit(cmd, rep)
			} else {
				fmt.Fprintf(out, "backend %s, run prefix %s/\n", backend.RedactURL(args[0]), prefix)
				conformance.WriteTable(out, res)
				fmt.Fprintf(out, "cleanup: removed %d object(s) under %s/\n", removed, prefix)
			}
			if n := res.Count(conformance.StatusFail); n > 0 {
				return bad(fmt.Errorf("%d of %d conformance case(s) failed on %s", n, len(res.Cases), backend.RedactURL(args[0])))
			}
			if cleanErr != nil {
				return fmt.Errorf("cleanup of %s: %w", runRoot, cleanErr)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&short, "short", false, "smaller large object (8 MiB), fewer concurrent writers")
	cmd.Flags().BoolVar(&large, "large", false, "write a 256 MiB large object (ignored with --short)")
	cmd.Flags().StringVar(&match, "run", "", "run only the cases whose names match this regular expression")
	cmd.Flags().DurationVar(&timeout, "timeout", conformance.DefaultCaseTimeout, "limit per case")
	return cmd
}

// purge deletes every object under st and returns how many it deleted.
func purge(ctx context.Context, st *backend.Store) (int, error) {
	var keys []string
	if err := st.List(ctx, "", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}); err != nil {
		return 0, err
	}
	for i, k := range keys {
		if err := st.Delete(ctx, k); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/ops/diff"
)

// diffOutput is the --json document of ckpt diff.
type diffOutput struct {
	header
	A           diffSide         `json:"a"`
	B           diffSide         `json:"b"`
	Keys        int              `json:"keys"`
	Compared    int              `json:"compared"`
	Bytes       int64            `json:"bytes"`
	Tolerance   *float64         `json:"tolerance,omitempty"`
	Identical   bool             `json:"identical"`
	Differences []diffDifference `json:"differences"`
}

// diffDifference is one key that differs in ckpt diff's --json document
// (a diff.Difference).
type diffDifference struct {
	Key        string   `json:"key"`
	Kind       string   `json:"kind"`
	A          string   `json:"a,omitempty"`
	B          string   `json:"b,omitempty"`
	SHA256A    string   `json:"sha256_a,omitempty"`
	SHA256B    string   `json:"sha256_b,omitempty"`
	MaxAbsDiff *float64 `json:"max_abs_diff,omitempty"`
	Elements   int64    `json:"elements_over_tolerance,omitempty"`
}

// differencesJSON converts ds (never nil, so the member is a list).
func differencesJSON(ds []diff.Difference) []diffDifference {
	out := make([]diffDifference, 0, len(ds))
	for _, d := range ds {
		out = append(out, diffDifference{Key: d.Key, Kind: d.Kind, A: d.A, B: d.B, SHA256A: d.SHA256A, SHA256B: d.SHA256B, MaxAbsDiff: d.MaxAbsDiff, Elements: d.Elements})
	}
	return out
}

type diffSide struct {
	URL string `json:"url"`
}

func newDiffCmd() *cobra.Command {
	var (
		asJSON    bool
		tolerance float64
	)
	cmd := &cobra.Command{
		Use:   "diff A B",
		Short: "Compare two checkpoints key by key (exit 0 identical, 1 different)",
		Long: `Compares two checkpoints of any formats the loader reads (a run URL stands
for its newest valid checkpoint), key by key: keys missing from B or extra
in B, a tensor against a bytes value, dtype and shape changes, and content.
Content is compared by the SHA-256 of each tensor's row-major little-endian
bytes (whatever the sharding), or with --tolerance X numerically: a tensor
differs when the maximum absolute difference of its elements exceeds X.
float32/float64/float16/bfloat16 and all integer types decode to numbers,
bool to 0/1, complex64 by the modulus of the difference; NaN equals NaN at
the same position and differs infinitely from a number. Bytes values
(param groups, scheduler, step) are compared as values: JSON on both sides
(a DCP item's pickled value decoded) compares numbers by value (0 = 0.0),
lists element-wise and objects member-wise, so the same state saved as DCP
and natively is identical; other values byte for byte. Tensors are streamed, both sides in step, so
memory does not follow tensor size.
Progress (keys compared / total, rate, ETA) is shown on a terminal.
Exit 0 when identical, 1 when different, 3 when nothing is stored under A
or B ("no such path"), 2 on usage errors, 4 on access errors.`,
		Example: `  ckpt diff ./runs/a/step-00000012 ./runs/b/step-00000012
  ckpt diff --tolerance 1e-6 ./runs/demo s3://bucket/runs/demo
  ckpt diff --json ./dcp-checkpoint ./runs/demo/step-00000012`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			a, _, err := openCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			defer a.Store().Close()
			b, _, err := openCheckpoint(ctx, args[1])
			if err != nil {
				return err
			}
			defer b.Store().Close()
			opts := diff.Options{UseTolerance: cmd.Flags().Changed("tolerance"), Tolerance: tolerance}
			p := newItemProgress(cmd, "diff", "keys")
			opts.Progress = p.callback()
			rep, err := diff.Compare(ctx, a, b, opts)
			p.finish()
			if err != nil {
				return err
			}
			if asJSON {
				emit(cmd, &diffOutput{A: diffSide{rep.A}, B: diffSide{rep.B}, Keys: rep.Keys, Compared: rep.Compared, Bytes: rep.BytesCompared,
					Tolerance: rep.Tolerance, Identical: rep.Identical, Differences: differencesJSON(rep.Differences)})
			} else {
				printDiff(cmd.OutOrStdout(), rep)
			}
			if !rep.Identical {
				return bad(fmt.Errorf("checkpoints differ in %d of %d keys", len(rep.Differences), rep.Keys))
			}
			return nil
		},
	}
	cmd.Flags().Float64Var(&tolerance, "tolerance", 0, "compare tensors numerically: differ when max |a-b| exceeds X")
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	return cmd
}

func printDiff(w io.Writer, r *diff.Report) {
	fmt.Fprintf(w, "a %s\nb %s\n", safe(r.A), safe(r.B))
	for _, d := range r.Differences {
		d.Key, d.A, d.B = safe(d.Key), safe(d.A), safe(d.B)
		switch d.Kind {
		case diff.KindMissing:
			fmt.Fprintf(w, "- %s: only in a (%s)\n", d.Key, d.A)
		case diff.KindExtra:
			fmt.Fprintf(w, "+ %s: only in b (%s)\n", d.Key, d.B)
		case diff.KindContent:
			if d.MaxAbsDiff != nil {
				fmt.Fprintf(w, "~ %s: %s, max |a-b| = %g, %d element(s) over tolerance\n", d.Key, d.A, *d.MaxAbsDiff, d.Elements)
			} else {
				fmt.Fprintf(w, "~ %s: %s, content differs (sha256 %.12s… vs %.12s…)\n", d.Key, d.A, d.SHA256A, d.SHA256B)
			}
		default:
			fmt.Fprintf(w, "~ %s: %s changed: %s -> %s\n", d.Key, d.Kind, d.A, d.B)
		}
	}
	if r.Identical {
		fmt.Fprintf(w, "identical: %d keys, %s compared\n", r.Keys, humanBytes(r.BytesCompared))
	} else {
		fmt.Fprintf(w, "different: %d of %d keys differ\n", len(r.Differences), r.Keys)
	}
}

package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ckptkit/ckptkit/loader"
)

// verifyOutput is the --json document of ckpt verify.
type verifyOutput struct {
	header
	URL       string          `json:"url"`
	Format    string          `json:"format,omitempty"`
	Version   string          `json:"version,omitempty"`
	Writer    string          `json:"writer,omitempty"`
	Iteration int64           `json:"iteration"`
	Deep      bool            `json:"deep"`
	Resumable bool            `json:"resumable"`
	Problems  []verifyFinding `json:"problems"`
	Info      []verifyFinding `json:"info"`
	// Bytes counts the data bytes a deep verify read and checked (0
	// without --deep).
	Bytes      int64    `json:"bytes"`
	LazyParams []string `json:"lazy_params"`
	// NotChecked says what the verify did not check: the bytes (shallow),
	// or flipped bytes of a checkpoint that records no checksum (deep).
	NotChecked string `json:"not_checked,omitempty"`
}

// verifyFinding is a problem or piece of information in ckpt verify's
// --json document (a loader.Finding).
type verifyFinding struct {
	Rule    string `json:"rule"`
	Key     string `json:"key,omitempty"`
	Object  string `json:"object,omitempty"`
	Message string `json:"message"`
}

// findingsJSON converts fs (never nil, so the member is a list).
func findingsJSON(fs []loader.Finding) []verifyFinding {
	out := make([]verifyFinding, 0, len(fs))
	for _, f := range fs {
		out = append(out, verifyFinding{Rule: f.Rule, Key: f.Key, Object: f.Object, Message: f.Message})
	}
	return out
}

// shallowNote is what a verify without --deep did not check.
// noChecksumsNote is a deep verify's not_checked of a checkpoint that
// records no checksum (loader.VerifyReport.NoChecksums).
const noChecksumsNote = "no checksum is recorded (torch saved it with compute_crc32 = False and no ckptkit integrity object): every item was read and decoded, but a flipped data byte cannot be detected"

const shallowNote = "data bytes were not read: object sizes and metadata were checked, checksums were not (--deep reads every byte)"

func newVerifyCmd() *cobra.Command {
	var asJSON, deep bool
	cmd := &cobra.Command{
		Use:   "verify URL",
		Short: "Pre-flight check that a checkpoint is resumable (exit 0), or say why not (exit 1)",
		Long: `Reads the checkpoint's metadata once and reports every problem by rule:
uncommitted, missing-object, object-size, partial-optimizer-state,
shard-coverage, layout-mismatch, and with --deep (which reads every byte)
checksum. Lazily-absent optimizer state (parameters that never received a
gradient, so have no optimizer state yet) is reported as information.
Without --deep, data bytes are not read, so a flipped byte is not found:
the output says so.
Exit 0 when resumable, 1 when not, 3 when nothing is stored under URL
("no such path"), 2 on usage errors, 4 on access errors.`,
		Example: `  ckpt verify ./runs/demo/step-00000012
  ckpt verify --deep s3://bucket/runs/demo/step-00000012
  ckpt verify --deep --json gs://bucket/run/step-00000100`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, err := openStore(ctx, args[0])
			if err != nil {
				return err
			}
			defer st.Close()
			var p *progress
			if deep {
				p = newProgress(cmd, "verify")
			}
			rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: deep, Progress: p.callback()})
			p.finish()
			if err != nil {
				return err
			}
			if !rep.Resumable && len(rep.Problems) == 1 && rep.Problems[0].Rule == loader.RuleUncommitted {
				// No metadata object: is anything stored there at all?
				if err := requirePath(ctx, st); err != nil {
					return err
				}
			}
			out := &verifyOutput{URL: rep.URL, Format: rep.Format, Version: rep.Version, Writer: rep.Writer, Iteration: rep.Iteration,
				Deep: rep.Deep, Resumable: rep.Resumable, Problems: findingsJSON(rep.Problems), Info: findingsJSON(rep.Info), Bytes: rep.BytesChecked, LazyParams: rep.LazyParams}
			switch {
			case !deep:
				out.NotChecked = shallowNote
			case rep.NoChecksums:
				out.NotChecked = noChecksumsNote
			}
			if asJSON {
				emit(cmd, out)
			} else {
				printVerify(cmd.OutOrStdout(), out)
			}
			if !rep.Resumable {
				return bad(fmt.Errorf("%s is not resumable: %d problem(s)", rep.URL, len(rep.Problems)))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, jsonHelp)
	cmd.Flags().BoolVar(&deep, "deep", false, "read every byte and check every checksum")
	return cmd
}

func printVerify(w io.Writer, r *verifyOutput) {
	fmt.Fprintf(w, "checkpoint %s\n", safe(r.URL))
	if r.Format != "" {
		// The writer goes out as it is, not through fmt's buffer: it is
		// the document's to size (a 500 MB one was one more copy).
		fmt.Fprintf(w, "format %s %s (", safe(r.Format), safe(r.Version))
		io.WriteString(w, safe(r.Writer))
		fmt.Fprintf(w, "), iteration %d\n", r.Iteration)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "PROBLEM [%s] %s\n", p.Rule, safe(p.Message))
	}
	for _, i := range r.Info {
		fmt.Fprintf(w, "info    [%s] %s\n", i.Rule, safe(i.Message))
	}
	if r.Deep {
		verb := "checked"
		if r.NotChecked != "" {
			verb = "read"
		}
		fmt.Fprintf(w, "deep: %d bytes %s\n", r.Bytes, verb)
	}
	switch {
	case r.Resumable && r.Deep && r.NotChecked != "":
		fmt.Fprintf(w, "OK: resumable, every byte read: %s\n", r.NotChecked)
	case r.Resumable && r.Deep:
		fmt.Fprintln(w, "OK: resumable (every byte checked)")
	case r.Resumable:
		fmt.Fprintf(w, "OK: resumable, shallow check: %s\n", shallowNote)
	default:
		fmt.Fprintln(w, "NOT RESUMABLE")
	}
}

package conformance

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the case x backend matrix of rs: one row per case, one
// column per backend (pass, skip, FAIL, or - when the case did not run
// there), a totals row, then one note per skip (its reason) and failure
// (its first messages, condensed to one line).
func WriteTable(w io.Writer, rs ...Results) {
	var names []string
	seen := map[string]bool{}
	cells := make([]map[string]Result, len(rs))
	for i, r := range rs {
		cells[i] = map[string]Result{}
		for _, c := range r.Cases {
			cells[i][c.Case] = c
			if !seen[c.Case] {
				seen[c.Case] = true
				names = append(names, c.Case)
			}
		}
	}
	fmt.Fprintln(w, "== conformance summary ==")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "case")
	for _, r := range rs {
		fmt.Fprintf(tw, "\t%s", r.Backend)
	}
	fmt.Fprintln(tw)
	for _, n := range names {
		fmt.Fprint(tw, n)
		for i := range rs {
			c, ok := cells[i][n]
			fmt.Fprintf(tw, "\t%s", cell(c, ok))
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "total")
	for _, r := range rs {
		fmt.Fprintf(tw, "\t%d pass, %d skip, %d fail (%s)", r.Count(StatusPass), r.Count(StatusSkip), r.Count(StatusFail), r.Duration.Round(time.Millisecond))
	}
	fmt.Fprintln(tw)
	_ = tw.Flush()
	for _, r := range rs {
		for _, c := range r.Cases {
			switch c.Status {
			case StatusSkip:
				fmt.Fprintf(w, "  skip %s %s: %s\n", r.Backend, c.Case, Condense(c.Message))
			case StatusFail:
				fmt.Fprintf(w, "  FAIL %s %s: %s\n", r.Backend, c.Case, Condense(c.Message))
			}
		}
	}
}

func cell(c Result, ok bool) string {
	switch {
	case !ok:
		return "-"
	case c.Status == StatusFail:
		return "FAIL"
	}
	return string(c.Status)
}

// maxNote bounds a condensed message.
const maxNote = 300

// Condense turns a failure message (testify's multi-line report included)
// into one line: the error and message text, without traces.
func Condense(msg string) string {
	var parts []string
	section := ""
	for _, line := range strings.Split(msg, "\n") {
		l := strings.TrimSpace(line)
		for _, k := range []string{"Error Trace:", "Error:", "Test:", "Messages:"} {
			if rest, ok := strings.CutPrefix(l, k); ok {
				section, l = k, strings.TrimSpace(rest)
				break
			}
		}
		if l == "" || section == "Error Trace:" || section == "Test:" {
			continue
		}
		parts = append(parts, l)
	}
	s := strings.Join(parts, " ")
	if r := []rune(s); len(r) > maxNote {
		s = string(r[:maxNote]) + "..."
	}
	return s
}

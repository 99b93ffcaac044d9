package main

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ckptkit/ckptkit/internal/bytesize"
)

// Stat summarises repeated measurements of one quantity.
type Stat struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Runs   []float64 `json:"runs"`
}

// newStat returns the median, minimum and maximum of xs (which it does not
// reorder). An empty xs gives a zero Stat.
func newStat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[len(s)-1], Runs: slices.Clone(xs)}
}

// seconds converts durations to float seconds.
func seconds(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// pairRatios returns base[i]/val[i] for paired runs (interleaved
// measurements share the machine's load at that moment).
func pairRatios(base, val []float64) []float64 {
	n := min(len(base), len(val))
	out := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		if val[i] > 0 {
			out = append(out, base[i]/val[i])
		}
	}
	return out
}

// Row is one line of the results table.
type Row struct {
	Figure string `json:"figure"`
	// Unit of Value and Baseline ("s", "MiB/s", "bytes", "count", ...).
	Unit     string `json:"unit"`
	Value    *Stat  `json:"value,omitempty"`
	Baseline *Stat  `json:"baseline,omitempty"`
	// Ratio is baseline_time/ckptkit_time (a throughput ratio) for I/O
	// figures, or a growth factor for scale figures.
	Ratio *Stat  `json:"ratio,omitempty"`
	Goal  string `json:"goal"`
	// Met is nil when the figure has no goal or was skipped.
	Met     *bool  `json:"met,omitempty"`
	Skipped string `json:"skipped,omitempty"`
	Note    string `json:"note,omitempty"`
}

func boolp(b bool) *bool { return &b }

func statp(s Stat) *Stat { return &s }

// fmtStat prints "median [min, max]" with the unit's precision.
func fmtStat(s *Stat, unit string) string {
	if s == nil {
		return "-"
	}
	f := func(x float64) string { return fmtNum(x, unit) }
	if s.Min == s.Max {
		return f(s.Median) + " " + unit
	}
	return fmt.Sprintf("%s [%s, %s] %s", f(s.Median), f(s.Min), f(s.Max), unit)
}

func fmtNum(x float64, unit string) string {
	switch unit {
	case "count", "bytes", "B/entry":
		return strconv.FormatFloat(x, 'f', -1, 64)
	case "s", "CPU s":
		if x < 0.1 {
			return strconv.FormatFloat(x, 'g', 3, 64)
		}
		return strconv.FormatFloat(x, 'f', 3, 64)
	case "MiB", "MiB/s":
		return strconv.FormatFloat(x, 'f', 0, 64)
	default:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
}

func (r *Row) metString() string {
	switch {
	case r.Skipped != "":
		return "skipped"
	case r.Met == nil:
		return "n/a"
	case *r.Met:
		return "yes"
	default:
		return "NO"
	}
}

// positiveSize parses a -size flag (bytesize's unit rule) that must be
// above zero.
func positiveSize(s string) (int64, error) {
	n, err := bytesize.Parse(s)
	if err == nil && n <= 0 {
		err = fmt.Errorf("size %q: want a positive number of bytes", s)
	}
	return n, err
}

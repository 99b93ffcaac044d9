// Package conformance is the suite every ckptkit backend and plugin runs:
// storage semantics (errors, atomic writes, ranges, listing, key rules,
// prefixes, large and concurrent objects) and the checkpoint resume rules,
// through the public API on the backend under test.
//
// From go test, a backend author writes one test and one TestMain:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{Name: "mine", NewStore: newEmptyStore})
//	}
//
//	func TestMain(m *testing.M) { conformance.Main(m) }
//
// Main prints the backend x case summary table of every Run in the test
// binary after the tests. Outside go test (the ckpt conformance command),
// RunAll runs the same cases and returns the results.
//
// Known deviations are declared as data in Harness.Skip, never by editing
// asserts; a Skip entry naming no case fails the run, so declarations cannot
// outlive the case they excuse. Cases that need a capability the driver
// does not declare (Capabilities) skip themselves with the reason.
//
// The checkpoint/dcp-* cases write real PyTorch DCP checkpoints, embedded
// in the package, object by object through the store under test, so they
// run wherever the suite runs.
package conformance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
)

// T is the part of *testing.T the cases use. *testing.T implements it, and
// RunAll provides its own implementation, so the suite runs both under go
// test and from the ckpt command. It satisfies testify's require.TestingT.
type T interface {
	// Errorf records a failure and continues.
	Errorf(format string, args ...any)
	// FailNow marks the case failed and stops it (runtime.Goexit).
	FailNow()
	// Fatalf is Errorf followed by FailNow.
	Fatalf(format string, args ...any)
	// Failed reports whether the case has failed.
	Failed() bool
	// Helper marks the caller as a helper for line reporting.
	Helper()
	// Name returns the case's name.
	Name() string
	// Logf records a note shown with the case's output.
	Logf(format string, args ...any)
	// Skip and Skipf record the reason and stop the case as skipped.
	Skip(args ...any)
	Skipf(format string, args ...any)
	// Cleanup registers f to run after the case, last registered first.
	Cleanup(f func())
	// TempDir returns a fresh directory removed after the case.
	TempDir() string
	// Context is cancelled when the case ends, before cleanups run.
	Context() context.Context
}

var _ T = (*testing.T)(nil)

// LargeEnv is the environment variable that, set to 1, makes the
// large-object case write LargeObjectSize bytes instead of
// DefaultObjectSize (never in short mode).
const LargeEnv = "CKPTKIT_CONFORMANCE_LARGE"

// Sizes of the object written by the storage/large-object case. The case
// grows the object to at least 2.5 parts when the driver declares a
// multipart part size, so that several parts and a partial last part are
// exercised.
const (
	ShortObjectSize   = 8 << 20
	DefaultObjectSize = 24 << 20
	LargeObjectSize   = 256 << 20
)

// Harness describes the backend under test.
type Harness struct {
	// Name labels the backend in the summary (a column of the table).
	Name string
	// NewStore returns a fresh, empty store for one case and registers any
	// cleanup with t.Cleanup. It may fail the case through t (for example
	// with require.NoError). Stores of drivers with a multipart path should
	// be opened with small parts (for s3: ?part_size=5MiB&
	// multipart_threshold=5MiB) so storage/large-object crosses parts.
	NewStore func(t T) *backend.Store
	// Skip maps case names (as listed by Cases) to the reason the backend
	// cannot pass them: a known deviation or a missing capability. A name
	// without the "@prefix" suffix also skips the prefixed variant. Names
	// that match no case fail the harness/skip-names check.
	Skip map[string]string
	// Large makes storage/large-object write LargeObjectSize bytes (unless
	// in short mode); the LargeEnv variable does the same.
	Large bool
	// Leftovers, when set, runs after every storage case that passed (plain
	// and @prefix) with the store the case worked on, and fails the case
	// when the backend kept debris of its writes that the portable API
	// cannot see: incomplete multipart uploads, temporary files. Failed,
	// cancelled and lost writes must leave none.
	Leftovers func(t T, st *backend.Store)
}

// SkipCheckName is the pseudo-case, run first, that fails when
// Harness.Skip names a case that does not exist.
const SkipCheckName = "harness/skip-names"

// prefixSuffix marks the variant of a storage case run inside st.Sub of a
// random prefix.
const prefixSuffix = "@prefix"

// env is what a case gets besides its T: the harness and the run's mode.
type env struct {
	h     *Harness
	short bool
	size  int64 // base size of storage/large-object
}

type testCase struct {
	name string
	run  func(t T, e *env)
}

// Cases lists every case name, in run order (the skip-name check is not a
// case).
func Cases() []string {
	var out []string
	for _, c := range allCases() {
		out = append(out, c.name)
	}
	return out
}

func allCases() []testCase {
	return append(append(expandStorage(append(storageCases, delimiterCases...)), checkpointCases...), append(optimizerCases, runLayerCases...)...)
}

// UnknownSkips returns the keys of h.Skip that name no case, sorted.
func UnknownSkips(h Harness) []string {
	known := map[string]bool{}
	for _, n := range Cases() {
		known[n] = true
	}
	var out []string
	for k := range h.Skip {
		if !known[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// skipReason returns the declared reason to skip case name.
func skipReason(skip map[string]string, name string) (string, bool) {
	if r, ok := skip[name]; ok {
		return r, true
	}
	if base, ok := strings.CutSuffix(name, prefixSuffix); ok {
		r, ok := skip[base]
		return r, ok
	}
	return "", false
}

func checkSkips(t T, h *Harness) {
	if u := UnknownSkips(*h); len(u) > 0 {
		t.Errorf("Harness.Skip names %d unknown case(s): %s (see conformance.Cases)", len(u), strings.Join(u, ", "))
	}
}

func objectSize(h *Harness, short bool) int64 {
	switch {
	case short:
		return ShortObjectSize
	case h.Large || os.Getenv(LargeEnv) == "1":
		return LargeObjectSize
	}
	return DefaultObjectSize
}

// Run runs every case against h as subtests of t named after the cases
// (and SkipCheckName first), and records the results for PrintSummary and
// Main. Short mode (go test -short) shrinks the large object.
func Run(t *testing.T, h Harness) {
	t.Helper()
	e := &env{h: &h, short: testing.Short(), size: objectSize(&h, testing.Short())}
	run := func(name string, f func(t T)) {
		t.Run(name, func(t *testing.T) {
			rt := &recordingT{T: t}
			start := time.Now()
			// Registered first, so it runs after every cleanup of the case.
			t.Cleanup(func() { record(h.Name, rt.result(name, time.Since(start))) })
			f(rt)
		})
	}
	run(SkipCheckName, func(t T) { checkSkips(t, &h) })
	for _, c := range allCases() {
		run(c.name, func(t T) {
			if reason, ok := skipReason(h.Skip, c.name); ok {
				t.Skip(reason)
			}
			c.run(t, e)
		})
	}
}

// recordingT is a *testing.T that also keeps failure messages and the skip
// reason for the summary.
type recordingT struct {
	*testing.T
	mu     sync.Mutex
	errs   []string
	reason string
}

func (r *recordingT) note(msg string) {
	r.mu.Lock()
	r.errs = append(r.errs, msg)
	r.mu.Unlock()
}

// Errorf implements T.
func (r *recordingT) Errorf(format string, args ...any) {
	r.T.Helper()
	r.note(fmt.Sprintf(format, args...))
	r.T.Errorf(format, args...)
}

// Fatalf implements T.
func (r *recordingT) Fatalf(format string, args ...any) {
	r.T.Helper()
	r.note(fmt.Sprintf(format, args...))
	r.T.Fatalf(format, args...)
}

// Skip implements T.
func (r *recordingT) Skip(args ...any) {
	r.T.Helper()
	r.setReason(strings.TrimSpace(fmt.Sprintln(args...)))
	r.T.Skip(args...)
}

// Skipf implements T.
func (r *recordingT) Skipf(format string, args ...any) {
	r.T.Helper()
	r.setReason(fmt.Sprintf(format, args...))
	r.T.Skipf(format, args...)
}

func (r *recordingT) setReason(s string) {
	r.mu.Lock()
	r.reason = s
	r.mu.Unlock()
}

func (r *recordingT) result(name string, d time.Duration) Result {
	res := Result{Case: name, Status: StatusPass, Duration: d}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.T.Failed():
		res.Status = StatusFail
		res.Message = strings.Join(r.errs, "\n")
		if res.Message == "" {
			res.Message = "failed (see test output)"
		}
	case r.T.Skipped():
		res.Status = StatusSkip
		res.Message = r.reason
	}
	return res
}

// registry holds the results of every Run in this process, per backend, in
// the order backends first ran.
var registry struct {
	mu    sync.Mutex
	order []string
	rows  map[string]*Results
}

func record(backendName string, r Result) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.rows == nil {
		registry.rows = map[string]*Results{}
	}
	rs, ok := registry.rows[backendName]
	if !ok {
		rs = &Results{Backend: backendName}
		registry.rows[backendName] = rs
		registry.order = append(registry.order, backendName)
	}
	rs.Cases = append(rs.Cases, r)
	rs.Duration += r.Duration
}

// Recorded returns a copy of the results Run recorded in this process.
func Recorded() []Results {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	out := make([]Results, 0, len(registry.order))
	for _, name := range registry.order {
		rs := *registry.rows[name]
		rs.Cases = append([]Result(nil), rs.Cases...)
		out = append(out, rs)
	}
	return out
}

// PrintSummary writes the table of every result Run recorded in this
// process (nothing when Run did not run).
func PrintSummary(w io.Writer) {
	if rs := Recorded(); len(rs) > 0 {
		WriteTable(w, rs...)
	}
}

// SummaryFileEnv names an environment variable: when set, Main also
// appends the summary table to that file (CI artefacts, and a way to see
// the table although go test hides the output of passing packages).
const SummaryFileEnv = "CKPTKIT_CONFORMANCE_SUMMARY"

// Main is a TestMain for packages that call Run: it runs the tests, prints
// the summary of this test binary's backends to stdout (go test shows it
// with -v, for failing packages, or in local directory mode), appends it to
// the file named by SummaryFileEnv if set, and exits with the tests' code.
func Main(m *testing.M) {
	code := m.Run()
	ReportSummary()
	os.Exit(code)
}

// ReportSummary prints the rows recorded by Run in this process to stdout
// and appends them to the file named by $CKPTKIT_CONFORMANCE_SUMMARY, if
// set. Main calls it; a package with a TestMain of its own calls it after
// m.Run.
func ReportSummary() {
	PrintSummary(os.Stdout)
	if path := os.Getenv(SummaryFileEnv); path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			PrintSummary(f)
			if err := f.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "conformance: write %s: %v\n", path, err)
			}
		} else {
			fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

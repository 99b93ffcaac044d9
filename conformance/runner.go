package conformance

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// Status is the outcome of one case.
type Status string

// Case outcomes.
const (
	StatusPass Status = "pass"
	StatusSkip Status = "skip"
	StatusFail Status = "fail"
)

// Result is the outcome of one case on one backend.
type Result struct {
	Case   string
	Status Status
	// Message is the skip reason or the failure messages.
	Message  string
	Duration time.Duration
}

// Results are the outcomes of a run on one backend, in run order.
type Results struct {
	Backend  string
	Cases    []Result
	Duration time.Duration
}

// Count returns how many cases ended with s.
func (r Results) Count(s Status) int {
	n := 0
	for _, c := range r.Cases {
		if c.Status == s {
			n++
		}
	}
	return n
}

// Failed returns the failed cases.
func (r Results) Failed() []Result {
	var out []Result
	for _, c := range r.Cases {
		if c.Status == StatusFail {
			out = append(out, c)
		}
	}
	return out
}

// Get returns the result of case name.
func (r Results) Get(name string) (Result, bool) {
	for _, c := range r.Cases {
		if c.Case == name {
			return c, true
		}
	}
	return Result{}, false
}

// Options tune RunAll.
type Options struct {
	// Short shrinks the large object to ShortObjectSize.
	Short bool
	// Match, when set, runs only the cases whose names it matches (the
	// skip-name check always runs).
	Match *regexp.Regexp
	// CaseTimeout bounds one case (default 5 minutes): a case still running
	// then is recorded as failed and abandoned, its context cancelled.
	CaseTimeout time.Duration
	// Progress, when set, is called after each case.
	Progress func(backend string, r Result)
}

// DefaultCaseTimeout is the per-case limit of RunAll.
const DefaultCaseTimeout = 5 * time.Minute

// cleanupTimeout bounds one cleanup function, and the wait for a case that
// timed out to notice its cancelled context.
const cleanupTimeout = time.Minute

// RunAll runs every case against h outside go test, one case at a time,
// each in its own goroutine with a T whose FailNow and Skip end only that
// goroutine (runtime.Goexit). Panics are recovered and recorded as
// failures, cleanups always run, and ctx cancels the run. The first result
// is SkipCheckName.
func RunAll(ctx context.Context, h Harness, opts Options) Results {
	return runCases(ctx, &h, opts, allCases())
}

func runCases(ctx context.Context, h *Harness, opts Options, cases []testCase) Results {
	if opts.CaseTimeout <= 0 {
		opts.CaseTimeout = DefaultCaseTimeout
	}
	e := &env{h: h, short: opts.Short, size: objectSize(h, opts.Short)}
	out := Results{Backend: h.Name}
	add := func(r Result) {
		out.Cases = append(out.Cases, r)
		out.Duration += r.Duration
		if opts.Progress != nil {
			opts.Progress(h.Name, r)
		}
	}
	add(runOne(ctx, SkipCheckName, opts.CaseTimeout, func(t T) { checkSkips(t, h) }))
	for _, c := range cases {
		if opts.Match != nil && !opts.Match.MatchString(c.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			add(Result{Case: c.name, Status: StatusFail, Message: "not run: " + err.Error()})
			continue
		}
		add(runOne(ctx, c.name, opts.CaseTimeout, func(t T) {
			if reason, ok := skipReason(h.Skip, c.name); ok {
				t.Skip(reason)
			}
			c.run(t, e)
		}))
	}
	return out
}

// runOne runs f as case name with a fresh caseT and returns its result.
func runOne(parent context.Context, name string, timeout time.Duration, f func(t T)) Result {
	start := time.Now()
	ctx, cancel := context.WithCancel(parent)
	t := &caseT{name: name, ctx: ctx}
	done := t.guard(func() { f(t) })
	timer := time.NewTimer(timeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		t.Errorf("timed out after %v", timeout)
		cancel()
		waitFor(done, cleanupTimeout)
	case <-parent.Done():
		timer.Stop()
		t.Errorf("interrupted: %v", parent.Err())
		cancel()
		waitFor(done, cleanupTimeout)
	}
	cancel()
	t.runCleanups()
	return t.result(time.Since(start))
}

func waitFor(done <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

// caseT is the T of RunAll.
type caseT struct {
	name string
	ctx  context.Context

	mu       sync.Mutex
	failed   bool
	skipped  bool
	reason   string
	errs     []string
	logs     []string
	cleanups []func()
}

var _ T = (*caseT)(nil)

// guard runs f on a new goroutine and returns a channel closed when f ends,
// normally, through runtime.Goexit (FailNow, Skip) or by a panic, which is
// recorded as a failure.
func (t *caseT) guard(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		f()
	}()
	return done
}

func (t *caseT) runCleanups() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		if !waitFor(t.guard(f), cleanupTimeout) {
			t.Errorf("cleanup still running after %v; abandoned", cleanupTimeout)
		}
	}
}

func (t *caseT) result(d time.Duration) Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Result{Case: t.name, Status: StatusPass, Duration: d}
	switch {
	case t.failed:
		r.Status = StatusFail
		r.Message = strings.Join(t.errs, "\n")
		if len(t.logs) > 0 {
			r.Message += "\nlog:\n" + strings.Join(t.logs, "\n")
		}
	case t.skipped:
		r.Status = StatusSkip
		r.Message = t.reason
	}
	return r
}

// Errorf implements T.
func (t *caseT) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	t.errs = append(t.errs, fmt.Sprintf(format, args...))
}

// FailNow implements T: it ends the calling goroutine, which must be the
// case's own.
func (t *caseT) FailNow() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	runtime.Goexit()
}

// Fatalf implements T.
func (t *caseT) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	t.FailNow()
}

// Failed implements T.
func (t *caseT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

// Helper implements T; RunAll reports no line numbers.
func (t *caseT) Helper() {}

// Name implements T.
func (t *caseT) Name() string { return t.name }

// Logf implements T; logs are shown with failures.
func (t *caseT) Logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.logs = append(t.logs, fmt.Sprintf(format, args...))
}

// Skip implements T.
func (t *caseT) Skip(args ...any) { t.skipNow(strings.TrimSpace(fmt.Sprintln(args...))) }

// Skipf implements T.
func (t *caseT) Skipf(format string, args ...any) { t.skipNow(fmt.Sprintf(format, args...)) }

func (t *caseT) skipNow(reason string) {
	t.mu.Lock()
	t.skipped = true
	t.reason = reason
	t.mu.Unlock()
	runtime.Goexit()
}

// Cleanup implements T.
func (t *caseT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// TempDir implements T.
func (t *caseT) TempDir() string {
	dir, err := os.MkdirTemp("", "ckptkit-conformance-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Context implements T.
func (t *caseT) Context() context.Context { return t.ctx }

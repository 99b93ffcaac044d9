package conformance

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunnerOutcomes drives runCases with synthetic cases and checks each
// outcome RunAll must record: pass, require failure (nothing after it
// runs), Errorf (the case continues), panic, skip with reason, timeout; and
// that cleanups run last-first, after the context is cancelled, even after
// FailNow.
func TestRunnerOutcomes(t *testing.T) {
	var mu sync.Mutex
	var trace []string
	note := func(s string) {
		mu.Lock()
		trace = append(trace, s)
		mu.Unlock()
	}
	cases := []testCase{
		{"pass", func(t T, e *env) { require.Equal(t, 1, 1) }},
		{"require", func(t T, e *env) {
			t.Cleanup(func() { note("cleanup-1") })
			t.Cleanup(func() {
				if t.Context().Err() == nil {
					note("context still live in cleanup")
				}
				note("cleanup-2")
			})
			require.NoError(t, errors.New("boom"), "while testing")
			note("after FailNow")
		}},
		{"errorf", func(t T, e *env) {
			t.Errorf("first")
			t.Errorf("second")
			note("after Errorf")
		}},
		{"panic", func(t T, e *env) { panic("kaboom") }},
		{"skip", func(t T, e *env) {
			t.Skipf("no %s here", "capability")
			note("after Skip")
		}},
		{"timeout", func(t T, e *env) {
			<-t.Context().Done()
			note("timeout ctx cancelled")
		}},
		{"tempdir", func(t T, e *env) {
			require.DirExists(t, t.TempDir())
			require.Equal(t, "tempdir", t.Name())
		}},
	}
	res := runCases(context.Background(), &Harness{Name: "synthetic"}, Options{CaseTimeout: 300 * time.Millisecond}, cases)
	want := map[string]Status{SkipCheckName: StatusPass, "pass": StatusPass, "require": StatusFail, "errorf": StatusFail,
		"panic": StatusFail, "skip": StatusSkip, "timeout": StatusFail, "tempdir": StatusPass}
	require.Len(t, res.Cases, len(want))
	for _, r := range res.Cases {
		assert.Equal(t, want[r.Case], r.Status, "%s: %s", r.Case, r.Message)
	}
	get := func(n string) Result { r, _ := res.Get(n); return r }
	assert.Contains(t, get("require").Message, "boom")
	assert.Contains(t, Condense(get("require").Message), "while testing")
	assert.NotContains(t, Condense(get("require").Message), "Error Trace")
	assert.Equal(t, "first\nsecond", get("errorf").Message)
	assert.Contains(t, get("panic").Message, "panic: kaboom")
	assert.Equal(t, "no capability here", get("skip").Message)
	assert.Contains(t, get("timeout").Message, "timed out after 300ms")
	assert.Equal(t, []string{"cleanup-2", "cleanup-1", "after Errorf", "timeout ctx cancelled"}, trace)
	assert.Equal(t, 3, res.Count(StatusPass))
	assert.Len(t, res.Failed(), 4)

	var b strings.Builder
	WriteTable(&b, res)
	out := b.String()
	assert.Regexp(t, `(?m)^panic\s+FAIL$`, out)
	assert.Regexp(t, `(?m)^skip\s+skip$`, out)
	assert.Contains(t, out, "skip synthetic skip: no capability here")
	assert.Contains(t, out, "FAIL synthetic panic: panic: kaboom")
	assert.Regexp(t, `total\s+3 pass, 1 skip, 4 fail`, out)
}

func TestRunnerStopsOnCancelledRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cases := []testCase{
		{"first", func(t T, e *env) { cancel(); <-t.Context().Done() }},
		{"second", func(t T, e *env) {}},
	}
	res := runCases(ctx, &Harness{Name: "x"}, Options{}, cases)
	r, _ := res.Get("first")
	assert.Equal(t, StatusFail, r.Status)
	assert.Contains(t, r.Message, "interrupted")
	r, _ = res.Get("second")
	assert.Equal(t, StatusFail, r.Status)
	assert.Contains(t, r.Message, "not run")
}

func TestObjectSize(t *testing.T) {
	t.Setenv(LargeEnv, "")
	assert.Equal(t, int64(DefaultObjectSize), objectSize(&Harness{}, false))
	assert.Equal(t, int64(ShortObjectSize), objectSize(&Harness{Large: true}, true), "short mode wins over Large")
	assert.Equal(t, int64(LargeObjectSize), objectSize(&Harness{Large: true}, false))
	t.Setenv(LargeEnv, "1")
	assert.Equal(t, int64(LargeObjectSize), objectSize(&Harness{}, false))
	assert.Equal(t, int64(ShortObjectSize), objectSize(&Harness{}, true))
}

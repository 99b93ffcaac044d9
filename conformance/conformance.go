// Package conformance is the suite every ckptkit backend and plugin runs:
// storage semantics (errors, atomic writes, ranges, listing, key rules) and
// the checkpoint resume rules, through the public API on the backend under
// test. A backend author writes one test:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{Name: "mine", NewStore: newEmptyStore})
//	}
//
// Known deviations are declared as data in Harness.Skip, never by editing
// asserts.
package conformance

import (
	"io"
	"log/slog"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
)

// Harness describes the backend under test.
type Harness struct {
	// Name labels the backend in the summary.
	Name string
	// NewStore returns a fresh, empty store for one case and registers its
	// cleanup with t.Cleanup.
	NewStore func(t *testing.T) *backend.Store
	// Skip maps case names (as listed by Cases) to the reason the backend
	// cannot pass them: a known deviation or a missing capability.
	Skip map[string]string
}

type testCase struct {
	name string
	run  func(t *testing.T, h *Harness)
}

// Cases lists every case name, in run order.
func Cases() []string {
	var out []string
	for _, c := range allCases() {
		out = append(out, c.name)
	}
	return out
}

func allCases() []testCase {
	return append(append([]testCase(nil), storageCases...), checkpointCases...)
}

// Run runs every case against h as subtests named after the cases.
func Run(t *testing.T, h Harness) {
	for _, c := range allCases() {
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := h.Skip[c.name]; ok {
				t.Skip(reason)
			}
			c.run(t, &h)
		})
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// storageCases are filled in by storage.go.
var storageCases []testCase

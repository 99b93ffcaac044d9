package gc_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/ops/gc"
)

var now = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type ent struct {
	step      int64
	committed bool
	age       time.Duration // -1: no mod time
	format    string
	foreign   int
}

func entries(es ...ent) []catalog.Entry {
	out := make([]catalog.Entry, len(es))
	for i, e := range es {
		out[i] = catalog.Entry{Name: catalog.StepName(e.step), Step: e.step, Committed: e.committed, Objects: 2, Bytes: 100, ForeignObjects: e.foreign}
		if e.age >= 0 {
			out[i].ModTime = now.Add(-e.age)
		}
		if e.committed {
			out[i].Format = metadata.FormatName
			if e.format != "" {
				out[i].Format = e.format
			}
		}
	}
	return out
}

func c(step int64, age time.Duration) ent { return ent{step: step, committed: true, age: age} }
func u(step int64, age time.Duration) ent { return ent{step: step, age: age} }

const h = time.Hour

func TestDecide(t *testing.T) {
	cases := []struct {
		name    string
		es      []catalog.Entry
		valid   int64 // -1: none
		p       gc.Policy
		deleted []int64
		reason  map[int64]string // substring of the reason of some steps
	}{
		{name: "keep last 2", es: entries(c(1, 9*h), c(2, 8*h), c(3, 7*h), c(4, 6*h)), valid: 4,
			p: gc.Policy{KeepLast: 2}, deleted: []int64{1, 2},
			reason: map[int64]string{4: "newest valid", 3: "last 2", 1: "outside"}},
		{name: "keep every", es: entries(c(10, 9*h), c(20, 8*h), c(30, 7*h), c(40, 6*h)), valid: 40,
			p: gc.Policy{KeepLast: 1, KeepEvery: 20}, deleted: []int64{10, 30},
			reason: map[int64]string{20: "multiple of 20"}},
		{name: "older than", es: entries(c(1, 9*h), c(2, 2*h), c(3, 1*h)), valid: 3,
			p: gc.Policy{KeepLast: 1, OlderThan: 5 * h}, deleted: []int64{1},
			reason: map[int64]string{2: "younger than 5h0m0s"}},
		{name: "never the newest valid, even with keep-last 1 and invalid newer ones",
			es: entries(c(1, 9*h), c(2, 8*h), c(3, 7*h)), valid: 2,
			p: gc.Policy{KeepLast: 1}, deleted: []int64{1},
			reason: map[int64]string{3: "fails verification", 2: "newest valid"}},
		{name: "newer than newest valid and young: being written",
			es: entries(c(1, 9*h), c(2, 8*h), u(3, time.Minute), c(4, time.Minute)), valid: 2,
			p: gc.Policy{KeepLast: 1, Grace: 10 * time.Minute}, deleted: []int64{1},
			reason: map[int64]string{3: "grace", 4: "grace"}},
		{name: "abandoned uncommitted past grace, below and above the newest valid",
			es: entries(u(1, 9*h), c(2, 8*h), u(3, 2*h)), valid: 2,
			p: gc.Policy{KeepLast: 1, Grace: h}, deleted: []int64{1, 3},
			reason: map[int64]string{1: "abandoned", 3: "abandoned"}},
		{name: "unknown age counts as young",
			es: entries(c(2, 8*h), u(3, -1)), valid: 2,
			p: gc.Policy{KeepLast: 1, Grace: h}, deleted: nil},
		{name: "foreign objects and foreign formats are never touched",
			es: entries(ent{step: 1, committed: true, age: 9 * h, format: "torch-dcp", foreign: 3}, ent{step: 2, age: 9 * h, foreign: 1}, ent{step: 3, committed: true, age: 9 * h, foreign: 1}, c(4, 8*h)), valid: 4,
			p: gc.Policy{KeepLast: 1}, deleted: nil,
			reason: map[int64]string{1: "did not write", 2: "did not write", 3: "did not write"}},
		{name: "format ckptkit only reads, without foreign objects",
			es: entries(ent{step: 1, committed: true, age: 9 * h, format: "read-only-format"}, c(4, 8*h)), valid: 4,
			p: gc.Policy{KeepLast: 1}, deleted: nil, reason: map[int64]string{1: "not written by ckptkit"}},
		{name: "DCP written by ckptkit.torch.save expires like native",
			es: entries(ent{step: 1, committed: true, age: 9 * h, format: "torch-dcp"}, ent{step: 2, committed: true, age: 9 * h, format: "torch-dcp"}, c(4, 8*h)), valid: 4,
			p: gc.Policy{KeepLast: 2}, deleted: []int64{1}},
		{name: "no valid checkpoint: only abandoned prefixes go",
			es: entries(c(1, 9*h), u(2, 9*h), c(3, 8*h)), valid: -1,
			p: gc.Policy{KeepLast: 1, Grace: h}, deleted: []int64{2},
			reason: map[int64]string{1: "no valid checkpoint"}},
		{name: "keep-last counts from the newest valid down",
			es: entries(c(1, 9*h), c(2, 8*h), c(3, 7*h), c(4, 6*h), c(5, 5*h)), valid: 3,
			p: gc.Policy{KeepLast: 2}, deleted: []int64{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			valid := ""
			if tc.valid >= 0 {
				valid = catalog.StepName(tc.valid)
			}
			ds, err := gc.Decide(tc.es, valid, tc.p, now)
			require.NoError(t, err)
			require.Len(t, ds, len(tc.es))
			var deleted []int64
			for i, d := range ds {
				assert.Equal(t, tc.es[i].Name, d.Entry.Name)
				assert.NotEmpty(t, d.Reason)
				if d.Delete {
					deleted = append(deleted, d.Entry.Step)
				}
				if want, ok := tc.reason[d.Entry.Step]; ok {
					assert.Contains(t, d.Reason, want, "step %d", d.Entry.Step)
				}
			}
			assert.Equal(t, tc.deleted, deleted)
		})
	}
}

func TestDecideRejectsBadPolicy(t *testing.T) {
	es := entries(c(1, h))
	for _, p := range []gc.Policy{{KeepLast: 0}, {KeepLast: 1, KeepEvery: -1}, {KeepLast: 1, Grace: -1}} {
		_, err := gc.Decide(es, "", p, now)
		require.ErrorIs(t, err, gc.ErrPolicy)
	}
	_, err := gc.Decide(es, catalog.StepName(9), gc.Policy{KeepLast: 1}, now)
	require.ErrorIs(t, err, gc.ErrPolicy)
}

package conformance_test

import (
	"context"
	"errors"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/conformance"
)

// These tests prove the suite can fail: each toy driver breaks one rule on
// top of a correct mem driver, and the cases guarding that rule, and only
// they, must fail.

// truncating publishes only the first half of every write, ignores the
// inner error and reports success.
type truncating struct{ backend.Driver }

func (d truncating) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	half := size / 2
	_ = d.Driver.Put(ctx, key, half, io.LimitReader(r, half), opts)
	return nil
}

// notFoundLiar reports missing objects with an unclassified error.
type notFoundLiar struct{ backend.Driver }

func (d notFoundLiar) hide(err error) error {
	if err != nil && d.Driver.ErrorCode(err) == backend.CodeNotFound {
		return errors.New("backend said no")
	}
	return err
}

func (d notFoundLiar) NewRangeReader(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := d.Driver.NewRangeReader(ctx, key, off, n)
	return rc, d.hide(err)
}

func (d notFoundLiar) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	a, err := d.Driver.Stat(ctx, key)
	return a, d.hide(err)
}

// prefixStripper loses the Store's Sub prefixes (segments "sub-xxxxxxxx/"
// as the suite makes them), so keys of different Sub stores collide.
type prefixStripper struct{ backend.Driver }

var subSegment = regexp.MustCompile(`sub-[0-9a-f]{8}/`)

func strip(key string) string { return subSegment.ReplaceAllString(key, "") }

func (d prefixStripper) NewRangeReader(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	return d.Driver.NewRangeReader(ctx, strip(key), off, n)
}

func (d prefixStripper) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	return d.Driver.Put(ctx, strip(key), size, r, opts)
}

func (d prefixStripper) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	return d.Driver.Stat(ctx, strip(key))
}

func (d prefixStripper) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	return d.Driver.List(ctx, strip(prefix), fn)
}

func (d prefixStripper) Delete(ctx context.Context, key string) error {
	return d.Driver.Delete(ctx, strip(key))
}

// runToy runs the storage cases on a fresh mem driver wrapped by wrap.
func runToy(t *testing.T, name string, wrap func(backend.Driver) backend.Driver) conformance.Results {
	t.Helper()
	h := conformance.Harness{Name: name, NewStore: func(t conformance.T) *backend.Store {
		st, err := backend.NewStore(wrap(mem.New()), "mem://"+name, "")
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}}
	res := conformance.RunAll(context.Background(), h, conformance.Options{Short: true, Match: regexp.MustCompile(`^storage/`)})
	var b strings.Builder
	conformance.WriteTable(&b, res)
	t.Log("\n" + b.String())
	return res
}

func requireStatus(t *testing.T, res conformance.Results, want conformance.Status, names ...string) {
	t.Helper()
	for _, n := range names {
		r, ok := res.Get(n)
		require.True(t, ok, "case %s did not run", n)
		require.Equal(t, want, r.Status, "%s on %s: %s", n, res.Backend, r.Message)
	}
}

func TestToyTruncatingWritesAreCaught(t *testing.T) {
	res := runToy(t, "truncating", func(d backend.Driver) backend.Driver { return truncating{d} })
	requireStatus(t, res, conformance.StatusFail,
		"storage/round-trip", "storage/round-trip@prefix", "storage/ranges", "storage/large-object",
		"storage/concurrent", "storage/size-mismatch")
	r, _ := res.Get("storage/round-trip")
	assert.Contains(t, r.Message, `stat size of "rt/obj-`, "round-trip must fail on the read-back size")
	r, _ = res.Get("storage/large-object")
	assert.Contains(t, r.Message, "stat size")
	// Rules a truncating writer does not break still pass.
	requireStatus(t, res, conformance.StatusPass,
		"storage/not-found", "storage/invalid-keys", "storage/list-cancel")
}

func TestToyMisreportedNotFoundIsCaught(t *testing.T) {
	res := runToy(t, "liar", func(d backend.Driver) backend.Driver { return notFoundLiar{d} })
	requireStatus(t, res, conformance.StatusFail, "storage/not-found", "storage/not-found@prefix")
	r, _ := res.Get("storage/not-found")
	assert.Contains(t, r.Message, backend.ErrNotFound.Error(), "the failure must be about ErrNotFound")
	assert.Contains(t, r.Message, "backend said no")
	requireStatus(t, res, conformance.StatusPass,
		"storage/round-trip", "storage/ranges", "storage/list-sorted", "storage/invalid-keys",
		"storage/large-object", "storage/concurrent", "storage/round-trip@prefix")
}

func TestToyPrefixCollisionIsCaught(t *testing.T) {
	res := runToy(t, "stripper", func(d backend.Driver) backend.Driver { return prefixStripper{d} })
	requireStatus(t, res, conformance.StatusFail, "storage/sub-isolation", "storage/sub-isolation@prefix",
		"storage/round-trip@prefix", "storage/list-sorted@prefix", "storage/zero-length@prefix")
	// Without Sub prefixes the toy is a correct driver: every other plain
	// case passes.
	for _, r := range res.Cases {
		if strings.HasSuffix(r.Case, "@prefix") || r.Case == "storage/sub-isolation" {
			continue
		}
		want := conformance.StatusPass
		if strings.HasPrefix(r.Case, "storage/wrong-crc32c") {
			want = conformance.StatusSkip // mem verifies no declared CRC32C
		}
		assert.Equal(t, want, r.Status, "%s: %s", r.Case, r.Message)
	}
}

func TestUnknownSkipNamesFail(t *testing.T) {
	h := conformance.Harness{
		Name:     "skips",
		NewStore: func(t conformance.T) *backend.Store { t.FailNow(); return nil },
		Skip: map[string]string{
			"storage/not-found":        "declared deviation",
			"storage/ranges@prefix":    "declared deviation, prefixed only",
			"storage/renamed-long-ago": "stale",
		},
	}
	require.Equal(t, []string{"storage/renamed-long-ago"}, conformance.UnknownSkips(h))
	res := conformance.RunAll(context.Background(), h, conformance.Options{Short: true, Match: regexp.MustCompile(`^storage/(not-found|ranges)`)})
	requireStatus(t, res, conformance.StatusFail, conformance.SkipCheckName, "storage/ranges")
	r, _ := res.Get(conformance.SkipCheckName)
	assert.Contains(t, r.Message, "storage/renamed-long-ago")
	requireStatus(t, res, conformance.StatusSkip, "storage/not-found", "storage/not-found@prefix", "storage/ranges@prefix")
	r, _ = res.Get("storage/ranges@prefix")
	assert.Equal(t, "declared deviation, prefixed only", r.Message)
}

func TestCasesAreUniqueAndPaired(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range conformance.Cases() {
		require.False(t, seen[n], "duplicate case %s", n)
		seen[n] = true
	}
	for n := range seen {
		if strings.HasPrefix(n, "storage/") && !strings.HasSuffix(n, "@prefix") {
			assert.True(t, seen[n+"@prefix"], "%s lacks its prefixed variant", n)
		}
	}
}

// bitRot flips one bit in every 256 bytes read from a DCP data file and
// reports success.
type bitRot struct{ backend.Driver }

type rotReader struct{ io.ReadCloser }

func (r rotReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	for i := 0; i < n; i += 256 {
		p[i] ^= 0x10
	}
	return n, err
}

func (d bitRot) NewRangeReader(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	rc, err := d.Driver.NewRangeReader(ctx, key, off, n)
	if err != nil || !strings.HasSuffix(key, ".distcp") {
		return rc, err
	}
	return rotReader{rc}, nil
}

// The DCP cases check the bytes that come back through the backend, not
// only that a load returns: a backend corrupting one bit of a data file
// fails them.
func TestToyBitRotFailsTheDCPCases(t *testing.T) {
	h := conformance.Harness{Name: "bitrot", NewStore: func(t conformance.T) *backend.Store {
		st, err := backend.NewStore(bitRot{mem.New()}, "mem://bitrot", "")
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}}
	res := conformance.RunAll(context.Background(), h, conformance.Options{Short: true, Match: regexp.MustCompile(`^checkpoint/dcp-`)})
	requireStatus(t, res, conformance.StatusFail, "checkpoint/dcp-lazy-moe-torch2", "checkpoint/dcp-sparse-optim-torch1")
}

// Harness.Leftovers runs after every storage case that passed, on the
// store the case used (the Sub store for @prefix runs), and its failure
// fails the case; checkpoint cases do not call it.
func TestLeftoversCheckFailsStorageCases(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	h := conformance.Harness{
		Name: "leftovers",
		NewStore: func(t conformance.T) *backend.Store {
			st, err := backend.NewStore(mem.New(), "mem://leftovers", "")
			require.NoError(t, err)
			t.Cleanup(func() { st.Close() })
			return st
		},
		Leftovers: func(t conformance.T, st *backend.Store) {
			mu.Lock()
			seen[t.Name()] = strings.Contains(st.String(), "/sub-")
			mu.Unlock()
			t.Errorf("debris left below %s", st)
		},
	}
	res := conformance.RunAll(context.Background(), h, conformance.Options{Short: true, Match: regexp.MustCompile(`^(storage/(zero-length|wrong-crc32c)|checkpoint/metadata-read-once)`)})
	requireStatus(t, res, conformance.StatusFail, "storage/zero-length", "storage/zero-length@prefix")
	requireStatus(t, res, conformance.StatusSkip, "storage/wrong-crc32c")
	requireStatus(t, res, conformance.StatusPass, "checkpoint/metadata-read-once")
	r, _ := res.Get("storage/zero-length")
	assert.Contains(t, r.Message, "debris left below")
	assert.Equal(t, map[string]bool{"storage/zero-length": false, "storage/zero-length@prefix": true}, seen)
}

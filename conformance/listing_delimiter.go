package conformance

import (
	"errors"
	"sort"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
)

// delimiterCases are the storage cases of the one-level listing; they run
// plain and prefixed like every storage case.
var delimiterCases = []storageCase{
	{"storage/list-delimited", caseListDelimited},
}

// delimitedKeys hold objects at one level and deeper levels (a three-deep
// one, a non-ASCII one, and "b-" which sorts between "b" and "b/").
var delimitedKeys = []string{"dl/a", "dl/b-", "dl/b/1", "dl/b/2", "dl/b/c/3", "dl/c/4", "dl/é/5", "dl/z"}

// level is one delimited listing, objects (key -> size) and prefixes apart.
type level struct {
	objects  map[string]int64
	prefixes []string
}

func listLevel(t T, st *backend.Store, prefix string) level {
	t.Helper()
	l := level{objects: map[string]int64{}, prefixes: []string{}}
	require.NoError(t, st.ListDelimited(t.Context(), prefix, func(o backend.ObjectInfo) error {
		if o.IsPrefix {
			require.Zero(t, o.Size, "common prefix %q has no size", o.Key)
			l.prefixes = append(l.prefixes, o.Key)
			return nil
		}
		_, dup := l.objects[o.Key]
		require.False(t, dup, "object %q listed twice", o.Key)
		l.objects[o.Key] = o.Size
		return nil
	}), "ListDelimited(%q)", prefix)
	sort.Strings(l.prefixes)
	return l
}

// caseListDelimited: ListDelimited returns the objects directly under a
// prefix with their sizes and every deeper level once as a common prefix
// (IsPrefix, trailing "/"), without enumerating what is below the common
// prefixes; it is relative to the store, empty for a missing level,
// refuses a prefix that is not a clean key ending in "/" without reaching
// the driver, stops on a callback error, and forgets a level once its last
// object is deleted.
func caseListDelimited(t T, s *storeEnv) {
	ctx := t.Context()
	counter := instrument.Wrap(s.st.Driver())
	st := s.st.WithDriver(counter)
	for i, k := range delimitedKeys {
		put(t, st, k, pattern(uint64(i), i+1))
	}

	counter.Reset()
	got := listLevel(t, st, "dl/")
	require.Equal(t, map[string]int64{"dl/a": 1, "dl/b-": 2, "dl/z": 8}, got.objects, "objects directly under dl/")
	require.Equal(t, []string{"dl/b/", "dl/c/", "dl/é/"}, got.prefixes, "common prefixes under dl/, each once")
	require.Equal(t, int64(6), counter.Listed(), "a delimited listing must not enumerate the objects below its common prefixes")
	require.Equal(t, int64(1), counter.Count(instrument.OpListDelimited))
	require.Zero(t, counter.Count(instrument.OpList), "ListDelimited must not fall back to a full listing")

	got = listLevel(t, st, "dl/b/")
	require.Equal(t, map[string]int64{"dl/b/1": 3, "dl/b/2": 4}, got.objects)
	require.Equal(t, []string{"dl/b/c/"}, got.prefixes)

	got = listLevel(t, st, "")
	require.Contains(t, got.prefixes, "dl/", "the store's top level")
	for k := range got.objects {
		require.NotContains(t, delimitedKeys, k, "objects below dl/ must not appear at the top level")
	}

	got = listLevel(t, st, "nothing/")
	require.Empty(t, got.objects)
	require.Empty(t, got.prefixes)

	before := counter.Total()
	for _, p := range []string{"dl", "../", "/abs/", "a//", "a\x00/", "\xff/"} {
		err := st.ListDelimited(ctx, p, func(backend.ObjectInfo) error { return nil })
		require.ErrorIs(t, err, backend.ErrInvalidKey, "ListDelimited(%q): the prefix must be a clean key ending in /", p)
	}
	require.Equal(t, before, counter.Total(), "refused prefixes never reach the driver")

	errStop := errors.New("stop here")
	calls := 0
	err := st.ListDelimited(ctx, "dl/", func(backend.ObjectInfo) error { calls++; return errStop })
	require.ErrorIs(t, err, errStop, "a callback error is returned")
	require.Equal(t, 1, calls, "and stops the listing")

	for _, k := range []string{"dl/b/1", "dl/b/2", "dl/b/c/3"} {
		require.NoError(t, st.Delete(ctx, k))
	}
	got = listLevel(t, st, "dl/")
	require.Equal(t, []string{"dl/c/", "dl/é/"}, got.prefixes, "a level without objects is no common prefix")
}

package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/internal/detbytes"
)

// storageCase is a storage semantics case. Each runs twice: on the store
// NewStore returns ("storage/<name>") and on st.Sub of a random prefix
// ("storage/<name>@prefix"), where it must also stay confined to the prefix.
type storageCase struct {
	name string
	run  func(t T, s *storeEnv)
}

// storeEnv is what a storage case works on.
type storeEnv struct {
	*env
	st *backend.Store
}

var storageCases = []storageCase{
	{"storage/round-trip", caseRoundTrip},
	{"storage/not-found", caseNotFound},
	{"storage/delete-missing", caseDeleteMissing},
	{"storage/zero-length", caseZeroLength},
	{"storage/invisible-until-committed", caseInvisibleUntilCommitted},
	{"storage/cancelled-write", caseCancelledWrite},
	{"storage/failed-source", caseFailedSource},
	{"storage/size-mismatch", caseSizeMismatch},
	{"storage/wrong-crc32c", caseWrongCRC32C},
	{"storage/wrong-crc32c-multipart", caseWrongCRC32CMultipart},
	{"storage/create-if-absent", caseCreateIfAbsent},
	{"storage/ranges", caseRanges},
	{"storage/list-sorted", caseListSorted},
	{"storage/list-cancel", caseListCancel},
	{"storage/cancelled-calls", caseCancelledCalls},
	{"storage/invalid-keys", caseInvalidKeys},
	{"storage/sub-isolation", caseSubIsolation},
	{"storage/large-object", caseLargeObject},
	{"storage/concurrent", caseConcurrent},
}

// expandStorage turns each storage case into its plain and prefixed runs.
func expandStorage(cs []storageCase) []testCase {
	out := make([]testCase, 0, 2*len(cs))
	for _, c := range cs {
		out = append(out, testCase{c.name, func(t T, e *env) {
			st := e.h.NewStore(t)
			c.run(t, &storeEnv{env: e, st: st})
			checkLeftovers(t, e.h, st)
		}})
	}
	for _, c := range cs {
		out = append(out, testCase{c.name + prefixSuffix, func(t T, e *env) {
			runPrefixed(t, e, c.run)
		}})
	}
	return out
}

// checkLeftovers runs the harness's Leftovers check on a case that passed.
func checkLeftovers(t T, h *Harness, st *backend.Store) {
	if h.Leftovers != nil && !t.Failed() {
		h.Leftovers(t, st)
	}
}

// subName returns a random store prefix for Sub.
func subName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "sub-" + hex.EncodeToString(b[:])
}

// runPrefixed runs a storage case inside root.Sub(p) with decoy objects
// next to p, then checks the case wrote nothing outside p and left the
// decoys alone.
func runPrefixed(t T, e *env, run func(t T, s *storeEnv)) {
	ctx := t.Context()
	root := e.h.NewStore(t)
	p := subName()
	// "p-decoy" shares p's first bytes without its slash: a store that
	// forgets the slash lists it.
	decoys := map[string][]byte{"decoy": []byte("outside the prefix"), p + "-decoy": []byte("sibling of the prefix")}
	for k, v := range decoys {
		require.NoError(t, root.PutBytes(ctx, k, v, backend.PutOptions{}), "write decoy %q", k)
	}
	st, err := root.Sub(p)
	require.NoError(t, err)
	run(t, &storeEnv{env: e, st: st})
	checkLeftovers(t, e.h, st)

	for k, v := range decoys {
		got, err := root.ReadAll(ctx, k, 0)
		require.NoError(t, err, "decoy %q outside the prefix must survive", k)
		require.Equal(t, string(v), string(got), "decoy %q outside the prefix was changed", k)
	}
	var stray []string
	require.NoError(t, root.List(ctx, "", func(o backend.ObjectInfo) error {
		if _, ok := decoys[o.Key]; !ok && !strings.HasPrefix(o.Key, p+"/") {
			stray = append(stray, o.Key)
		}
		return nil
	}))
	require.Empty(t, stray, "objects written through Sub(%q) must stay under %q/", p, p)
}

// ---- helpers ----

// pattern returns n deterministic bytes for seed.
func pattern(seed uint64, n int) []byte { return detbytes.Bytes(seed, n) }

// oneShot hides every method of a reader but Read (an io.Seeker above
// all), so the Store gives a write from it exactly one attempt.
type oneShot struct{ r io.Reader }

func (o oneShot) Read(p []byte) (int, error) { return o.r.Read(p) }

// hookReader reads r and calls hook once, before the first read at or after
// byte after. A hook error ends that read.
type hookReader struct {
	r     io.Reader
	after int64
	hook  func() error
	done  bool
	read  int64
}

func (h *hookReader) Read(p []byte) (int, error) {
	if !h.done && h.read >= h.after {
		h.done = true
		if err := h.hook(); err != nil {
			return 0, err
		}
	}
	n, err := h.r.Read(p)
	h.read += int64(n)
	return n, err
}

// multipartBody returns the size of a body that crosses at least two part
// boundaries and ends in a partial part, and the part size, when the store
// declares a multipart path; 0, 0 otherwise.
func multipartBody(st *backend.Store) (size, part int64) {
	caps := st.Capabilities()
	if !caps.Multipart || caps.PartSize <= 0 {
		return 0, 0
	}
	return 2*caps.PartSize + caps.PartSize/2 + 123, caps.PartSize
}

// streamCRC is the CRC32C of the first size bytes of seed's stream.
func streamCRC(seed uint64, size int64) uint32 {
	h := crc32c.New()
	_, _ = io.Copy(h, detbytes.NewReader(seed, size)) // never fails
	return h.Sum32()
}

func put(t T, st *backend.Store, key string, data []byte) {
	t.Helper()
	require.NoError(t, st.PutBytes(t.Context(), key, data, backend.PutOptions{}), "put %q (%d bytes)", key, len(data))
}

// requireContent checks key's size through Stat and its bytes through a
// whole read, without dumping large payloads.
func requireContent(t T, st *backend.Store, key string, want []byte, msgAndArgs ...any) {
	t.Helper()
	ctx := t.Context()
	a, err := st.Stat(ctx, key)
	require.NoError(t, err, "stat %q", key)
	require.Equal(t, int64(len(want)), a.Size, "stat size of %q", key)
	got, err := st.ReadAll(ctx, key, 0)
	require.NoError(t, err, "read %q", key)
	if !bytes.Equal(want, got) {
		require.Fail(t, fmt.Sprintf("content of %q differs: read %d bytes, want %d (first difference at byte %d)", key, len(got), len(want), firstDiff(got, want)), msgAndArgs...)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// requireNotFound checks that key is missing on every read path.
func requireNotFound(t T, st *backend.Store, key string, why string) {
	t.Helper()
	ctx := t.Context()
	_, err := st.Stat(ctx, key)
	require.ErrorIs(t, err, backend.ErrNotFound, "stat %q: %s", key, why)
	rc, err := st.NewRangeReader(ctx, key, 0, -1)
	if err == nil {
		rc.Close()
	}
	require.ErrorIs(t, err, backend.ErrNotFound, "read %q: %s", key, why)
	rc, err = st.NewRangeReader(ctx, key, 1, 2)
	if err == nil {
		rc.Close()
	}
	require.ErrorIs(t, err, backend.ErrNotFound, "ranged read %q: %s", key, why)
}

// keys lists the keys under prefix.
func keys(t T, st *backend.Store, prefix string) []string {
	t.Helper()
	out := []string{}
	require.NoError(t, st.List(t.Context(), prefix, func(o backend.ObjectInfo) error {
		out = append(out, o.Key)
		return nil
	}), "list %q", prefix)
	return out
}

// readRange reads [off, off+length) (length < 0: to the end) through a
// range reader.
func readRange(ctx context.Context, st *backend.Store, key string, off, length int64) ([]byte, error) {
	rc, err := st.NewRangeReader(ctx, key, off, length)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// ---- cases ----

// caseRoundTrip: what is written reads back byte for byte, Stat reports
// the size, and an overwrite (shorter or longer) replaces the whole object.
func caseRoundTrip(t T, s *storeEnv) {
	st := s.st
	sizes := []int{1, 1000, 100_003}
	for i, n := range sizes {
		key := fmt.Sprintf("rt/obj-%d", i)
		data := pattern(uint64(i+1), n)
		put(t, st, key, data)
		requireContent(t, st, key, data)
	}
	// Overwrite with a shorter object: no stale tail may survive.
	short := pattern(99, 10)
	put(t, st, "rt/obj-2", short)
	requireContent(t, st, "rt/obj-2", short, "overwrite with a shorter object")
	long := pattern(98, 200_000)
	put(t, st, "rt/obj-0", long)
	requireContent(t, st, "rt/obj-0", long, "overwrite with a longer object")
	require.Equal(t, []string{"rt/obj-0", "rt/obj-1", "rt/obj-2"}, keys(t, st, ""))

	ctx := t.Context()
	a, err := st.Stat(ctx, "rt/obj-1")
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), a.ModTime, time.Hour, "Stat must report a modification time (near this machine's clock)")
	ok, err := st.Exists(ctx, "rt/obj-1")
	require.NoError(t, err)
	require.True(t, ok, "Exists of a written key")
	_, err = st.ReadAll(ctx, "rt/obj-1", 999)
	require.Error(t, err, "ReadAll must refuse an object above its limit")

	// A body that cannot be rewound (one attempt), with and without a
	// declared CRC32C; a backend that keeps a CRC32C keeps the right one.
	body := pattern(97, 70_001)
	sum := crc32c.Checksum(body)
	for i, opts := range []backend.PutOptions{{}, {CRC32C: &sum}} {
		key := fmt.Sprintf("rt/one-shot-%d", i)
		require.NoError(t, st.Put(ctx, key, int64(len(body)), oneShot{bytes.NewReader(body)}, opts), "Put of %q from a one-shot reader", key)
		requireContent(t, st, key, body)
		a, err := st.Stat(ctx, key)
		require.NoError(t, err)
		if a.CRC32C != nil {
			require.Equal(t, sum, *a.CRC32C, "stored CRC32C of %q", key)
		}
	}
}

// caseNotFound: a missing key is ErrNotFound on Stat, whole and ranged
// reads, ReadRange and ReadAll; Exists says false without error. Keys that
// are "directories" of existing keys, or below an existing key, are missing
// objects too.
func caseNotFound(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	requireNotFound(t, st, "nf/never-written", "never written")
	err := st.ReadRange(ctx, "nf/never-written", 0, make([]byte, 4))
	require.ErrorIs(t, err, backend.ErrNotFound, "ReadRange of a missing key")
	_, err = st.ReadAll(ctx, "nf/never-written", 0)
	require.ErrorIs(t, err, backend.ErrNotFound, "ReadAll of a missing key")
	ok, err := st.Exists(ctx, "nf/never-written")
	require.NoError(t, err, "Exists of a missing key")
	require.False(t, ok)

	put(t, st, "nf/dir/obj", []byte("x"))
	requireNotFound(t, st, "nf/dir", "a prefix of an existing key is not an object")
	requireNotFound(t, st, "nf/dir/obj/below", "below an existing object")
	requireNotFound(t, st, "nf/dir/ob", "a byte prefix of an existing key")
	rc, err := st.NewRangeReader(ctx, "nf/never-written", 0, 0)
	if err == nil {
		rc.Close()
	}
	require.ErrorIs(t, err, backend.ErrNotFound, "zero-length read of a missing key")
	_, err = st.Stat(ctx, "nf/never-written")
	require.ErrorContains(t, err, "nf/never-written", "a not-found error names the key")
	require.False(t, backend.IsTransient(err), "not-found is permanent: %v", err)
	for _, e := range []error{backend.ErrPermission, backend.ErrInvalidKey, backend.ErrTransient} {
		require.NotErrorIs(t, err, e, "not-found must match only ErrNotFound")
	}
}

// caseDeleteMissing: deleting a missing key succeeds, twice; deleting a
// prefix of existing keys deletes nothing; a deleted key is gone.
func caseDeleteMissing(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	require.NoError(t, st.Delete(ctx, "del/never-written"), "delete of a missing key")
	require.NoError(t, st.Delete(ctx, "del/never-written"), "second delete of a missing key")

	put(t, st, "del/dir/child", []byte("child"))
	put(t, st, "del/obj", []byte("obj"))
	require.NoError(t, st.Delete(ctx, "del/dir"), "delete of a key that only prefixes others")
	requireContent(t, st, "del/dir/child", []byte("child"), "deleting a prefix must not delete the keys under it")

	require.NoError(t, st.Delete(ctx, "del/obj"))
	requireNotFound(t, st, "del/obj", "after delete")
	require.NoError(t, st.Delete(ctx, "del/obj"), "delete again after delete")
	require.Equal(t, []string{"del/dir/child"}, keys(t, st, "del/"))

	// The last key of a "directory" goes, and the key can be written again.
	require.NoError(t, st.Delete(ctx, "del/dir/child"))
	requireNotFound(t, st, "del/dir/child", "after delete")
	require.Empty(t, keys(t, st, "del/"))
	put(t, st, "del/dir/child", []byte("again"))
	requireContent(t, st, "del/dir/child", []byte("again"), "a key rewritten after its directory emptied")
}

// caseZeroLength: empty objects exist, have size 0, list with size 0, read
// back empty (whole and ranged), and can replace a non-empty object.
func caseZeroLength(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	require.NoError(t, st.Put(ctx, "zero/empty", 0, bytes.NewReader(nil), backend.PutOptions{}))
	requireContent(t, st, "zero/empty", []byte{})
	got, err := readRange(ctx, st, "zero/empty", 0, 10)
	require.NoError(t, err, "ranged read of an empty object")
	require.Empty(t, got)

	put(t, st, "zero/was-full", []byte("not empty"))
	require.NoError(t, st.PutBytes(ctx, "zero/was-full", nil, backend.PutOptions{}))
	requireContent(t, st, "zero/was-full", []byte{}, "an empty object replaces a full one")

	var sizes []int64
	require.NoError(t, st.List(ctx, "zero/", func(o backend.ObjectInfo) error {
		sizes = append(sizes, o.Size)
		return nil
	}))
	require.Equal(t, []int64{0, 0}, sizes, "listing shows both empty objects with size 0")

	if st.Capabilities().CreateIfAbsent {
		once := backend.PutOptions{IfNotExists: true}
		require.NoError(t, st.PutBytes(ctx, "zero/created", nil, once), "create-if-absent of an empty object")
		requireContent(t, st, "zero/created", []byte{})
		require.ErrorIs(t, st.PutBytes(ctx, "zero/created", nil, once), backend.ErrAlreadyExists, "an empty object exists for create-if-absent")
	}
}

// gateReader delivers data but blocks once half of it has been consumed,
// until released or its context ends.
type gateReader struct {
	ctx      context.Context
	data     []byte
	pos      int
	half     int
	reached  chan struct{}
	release  chan struct{}
	once     sync.Once
	released bool
}

func newGate(ctx context.Context, data []byte) *gateReader {
	return &gateReader{ctx: ctx, data: data, half: len(data) / 2, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateReader) Read(p []byte) (int, error) {
	if g.pos >= len(g.data) {
		return 0, io.EOF
	}
	if g.pos >= g.half && !g.released {
		g.once.Do(func() { close(g.reached) })
		select {
		case <-g.release:
			g.released = true
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		}
	}
	end := len(g.data)
	if !g.released {
		end = g.half
	}
	n := copy(p, g.data[g.pos:end])
	g.pos += n
	return n, nil
}

// caseInvisibleUntilCommitted: while a Put is half-way through its body, a
// new key is invisible to Stat, reads and List, and an overwritten key
// still shows its old content; once the Put returns, the new content is
// there in full.
func caseInvisibleUntilCommitted(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	old := pattern(1, 1000)
	put(t, st, "pending/old", old)
	fresh := pattern(2, 256<<10)
	repl := pattern(3, 192<<10)

	for _, tc := range []struct {
		key  string
		data []byte
		prev []byte
	}{{"pending/new", fresh, nil}, {"pending/old", repl, old}} {
		gate := newGate(ctx, tc.data)
		var once sync.Once
		releaseGate := func() { once.Do(func() { close(gate.release) }) }
		t.Cleanup(releaseGate)
		errc := make(chan error, 1)
		go func() { errc <- st.Put(ctx, tc.key, int64(len(tc.data)), gate, backend.PutOptions{}) }()
		select {
		case <-gate.reached:
		case err := <-errc:
			t.Fatalf("Put of %q returned before consuming half its body: %v", tc.key, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("Put of %q did not read half its body within 30s", tc.key)
		}

		listed := map[string]int64{}
		require.NoError(t, st.List(ctx, "pending/", func(o backend.ObjectInfo) error {
			listed[o.Key] = o.Size
			return nil
		}))
		if tc.prev == nil {
			requireNotFound(t, st, tc.key, "a write in progress must be invisible")
			require.NotContains(t, listed, tc.key, "a write in progress must not be listed")
		} else {
			requireContent(t, st, tc.key, tc.prev, "while an overwrite is in progress, the old object must be served")
			require.Equal(t, int64(len(tc.prev)), listed[tc.key], "listing must show the old size during an overwrite")
		}

		releaseGate()
		select {
		case err := <-errc:
			require.NoError(t, err, "Put of %q after release", tc.key)
		case <-time.After(30 * time.Second):
			t.Fatalf("Put of %q did not finish within 30s of release", tc.key)
		}
		requireContent(t, st, tc.key, tc.data, "after the Put returns")
	}
}

// cancellingSource delivers size bytes and cancels its context once half
// are consumed, then keeps delivering.
type cancellingSource struct {
	data   []byte
	pos    int
	cancel context.CancelFunc
}

func (c *cancellingSource) Read(p []byte) (int, error) {
	if c.pos >= len(c.data) {
		return 0, io.EOF
	}
	if c.pos >= len(c.data)/2 {
		c.cancel()
	}
	n := copy(p[:min(len(p), 16<<10)], c.data[c.pos:])
	c.pos += n
	return n, nil
}

// caseCancelledWrite: a Put whose context is cancelled before or during
// the body returns an error matching context.Canceled promptly and leaves
// the old object (or nothing) in place.
func caseCancelledWrite(t T, s *storeEnv) {
	st := s.st
	old := pattern(4, 5000)
	put(t, st, "abort/old", old)
	body := pattern(5, 512<<10)

	pre, cancel := context.WithCancel(t.Context())
	cancel()
	for _, key := range []string{"abort/old", "abort/new"} {
		err := st.PutBytes(pre, key, body, backend.PutOptions{})
		require.ErrorIs(t, err, context.Canceled, "Put of %q with a cancelled context", key)
	}
	for _, key := range []string{"abort/old", "abort/new"} {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		err := st.Put(ctx, key, int64(len(body)), &cancellingSource{data: body, cancel: cancel}, backend.PutOptions{})
		cancel()
		require.ErrorIs(t, err, context.Canceled, "Put of %q cancelled mid-body", key)
		require.Less(t, time.Since(start), 10*time.Second, "a cancelled Put must return promptly")
	}
	// Through the multipart path: cancelled while a later part streams.
	if size, part := multipartBody(st); size > 0 {
		for _, key := range []string{"abort/old", "abort/new"} {
			ctx, cancel := context.WithCancel(t.Context())
			src := &hookReader{r: detbytes.NewReader(5, size), after: part + part/2, hook: func() error { cancel(); return nil }}
			start := time.Now()
			err := st.Put(ctx, key, size, src, backend.PutOptions{})
			cancel()
			require.ErrorIs(t, err, context.Canceled, "multipart Put of %q (%d bytes, parts of %d) cancelled in its second part", key, size, part)
			require.Less(t, time.Since(start), 20*time.Second, "a cancelled multipart Put must return promptly")
		}
	}
	requireContent(t, st, "abort/old", old, "a cancelled overwrite must leave the old object")
	requireNotFound(t, st, "abort/new", "a cancelled write must publish nothing")
	require.Equal(t, []string{"abort/old"}, keys(t, st, "abort/"))
}

var errSourceBroke = errors.New("conformance: source failed on purpose")

// failingSource delivers the first n bytes of data, then fails.
type failingSource struct {
	data []byte
	n    int
	pos  int
}

func (f *failingSource) Read(p []byte) (int, error) {
	if f.pos >= f.n {
		return 0, errSourceBroke
	}
	k := copy(p[:min(len(p), f.n-f.pos)], f.data[f.pos:])
	f.pos += k
	return k, nil
}

// caseFailedSource: a Put whose body fails midway returns that error
// (errors.Is) and never publishes, neither a new key nor over an old one.
func caseFailedSource(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	old := pattern(6, 3000)
	put(t, st, "fail/old", old)
	body := pattern(7, 300_000)
	for _, key := range []string{"fail/old", "fail/new"} {
		for _, n := range []int{0, 1, len(body) / 2, len(body) - 1} {
			err := st.Put(ctx, key, int64(len(body)), &failingSource{data: body, n: n}, backend.PutOptions{})
			require.ErrorIs(t, err, errSourceBroke, "Put of %q whose source fails after %d bytes", key, n)
			require.False(t, backend.IsTransient(err), "a source's failure is not transient: %v", err)
		}
	}
	// Through the multipart path: failing in a middle part and in the last.
	if size, part := multipartBody(st); size > 0 {
		for _, key := range []string{"fail/old", "fail/new"} {
			for _, at := range []int64{part + part/2, size - 100} {
				src := &hookReader{r: detbytes.NewReader(7, size), after: at, hook: func() error { return errSourceBroke }}
				err := st.Put(ctx, key, size, src, backend.PutOptions{})
				require.ErrorIs(t, err, errSourceBroke, "multipart Put of %q (%d bytes, parts of %d) whose source fails at %d", key, size, part, at)
			}
		}
	}
	requireContent(t, st, "fail/old", old, "a failed overwrite must leave the old object")
	requireNotFound(t, st, "fail/new", "a failed write must publish nothing")
	require.Equal(t, []string{"fail/old"}, keys(t, st, "fail/"), "no temporary object may be visible")
}

// caseSizeMismatch: a body shorter or longer than the declared size fails
// with ErrSizeMismatch and publishes nothing.
func caseSizeMismatch(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	old := pattern(8, 777)
	put(t, st, "size/old", old)
	body := pattern(9, 100_000)
	for _, key := range []string{"size/old", "size/new"} {
		for _, tc := range []struct {
			name     string
			declared int64
			data     []byte
		}{
			{"short by 10", int64(len(body)) + 10, body},
			{"short by 1", int64(len(body)) + 1, body},
			{"empty body", 5, nil},
			{"long by 1", int64(len(body)) - 1, body},
			{"long by 10", int64(len(body)) - 10, body},
			{"long, declared 0", 0, body[:3]},
		} {
			err := st.Put(ctx, key, tc.declared, bytes.NewReader(tc.data), backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch, "%s: Put of %q declaring %d bytes with %d", tc.name, key, tc.declared, len(tc.data))
			err = st.Put(ctx, key, tc.declared, oneShot{bytes.NewReader(tc.data)}, backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch, "%s: Put of %q from a one-shot reader declaring %d bytes with %d", tc.name, key, tc.declared, len(tc.data))
		}
	}
	counter := instrument.Wrap(st.Driver())
	err := st.WithDriver(counter).Put(ctx, "size/new", -1, bytes.NewReader(nil), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrSizeMismatch, "a negative size")
	require.Zero(t, counter.Total(), "a negative size is refused before the driver")
	requireContent(t, st, "size/old", old, "a mismatched overwrite must leave the old object")
	requireNotFound(t, st, "size/new", "a mismatched write must publish nothing")
}

// caseCreateIfAbsent: with Capabilities().CreateIfAbsent, IfNotExists
// writes fail with ErrAlreadyExists on an existing key, and of N
// concurrent creators exactly one wins. Without it, such writes are
// ErrUnsupported and the case is skipped.
func caseCreateIfAbsent(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	once := backend.PutOptions{IfNotExists: true}
	if !st.Capabilities().CreateIfAbsent {
		err := st.PutBytes(ctx, "cia/key", []byte("x"), once)
		require.ErrorIs(t, err, backend.ErrUnsupported, "IfNotExists without the capability")
		requireNotFound(t, st, "cia/key", "an unsupported create-if-absent must write nothing")
		t.Skip("backend does not declare Capabilities().CreateIfAbsent")
	}
	require.NoError(t, st.PutBytes(ctx, "cia/key", []byte("first"), once), "create of a fresh key")
	err := st.PutBytes(ctx, "cia/key", []byte("second"), once)
	require.ErrorIs(t, err, backend.ErrAlreadyExists, "create of an existing key")
	requireContent(t, st, "cia/key", []byte("first"), "a lost create must not overwrite")
	require.NoError(t, st.Delete(ctx, "cia/key"))
	require.NoError(t, st.PutBytes(ctx, "cia/key", []byte("third"), once), "create after delete")
	requireContent(t, st, "cia/key", []byte("third"))
	put(t, st, "cia/key", []byte("plain"))
	requireContent(t, st, "cia/key", []byte("plain"), "a plain write still overwrites")

	// Another writer creates the key while our create's body streams (in a
	// later part, on a multipart path): ours must lose at commit.
	size, after := int64(1<<20), int64(512<<10)
	if mp, part := multipartBody(st); mp > 0 {
		size, after = mp, part+part/2
	}
	winner := []byte("the other writer got here first")
	src := &hookReader{r: detbytes.NewReader(11, size), after: after, hook: func() error {
		return st.PutBytes(ctx, "cia/mid-upload", winner, once)
	}}
	err = st.Put(ctx, "cia/mid-upload", size, src, once)
	require.True(t, src.done, "the competing create ran while the body streamed")
	require.ErrorIs(t, err, backend.ErrAlreadyExists, "a create that lost the race while uploading %d bytes", size)
	require.False(t, backend.IsTransient(err), "a lost create is permanent: %v", err)
	requireContent(t, st, "cia/mid-upload", winner, "the winner's object survives a create that lost mid-upload")

	const creators = 8
	for round := range 3 {
		key := fmt.Sprintf("cia/race-%d", round)
		errs := make([]error, creators)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range creators {
			wg.Go(func() {
				<-start
				errs[i] = st.PutBytes(ctx, key, pattern(uint64(100+i), 4096+i), once)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "round %d: creators %d and %d both won", round, winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, err, backend.ErrAlreadyExists, "round %d: losing creator %d", round, i)
		}
		require.NotEqual(t, -1, winner, "round %d: no creator won", round)
		requireContent(t, st, key, pattern(uint64(100+winner), 4096+winner), "round %d: the winner's object", round)
	}
}

// caseRanges: ranged reads at the start, middle and end, past the end
// (short or empty, never an error), zero-length, a refused negative
// offset, ReadRange past the end (io.ErrUnexpectedEOF), and random ranges,
// all checked against the reference bytes.
func caseRanges(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	const n = 10_000
	ref := pattern(10, n)
	put(t, st, "rng/obj", ref)
	for _, tc := range []struct {
		name        string
		off, length int64
	}{
		{"start", 0, 10},
		{"middle", 4321, 1234},
		{"whole", 0, -1},
		{"to end", 9000, -1},
		{"exact tail", n - 10, 10},
		{"last byte", n - 1, 1},
		{"past end", n - 10, 100},
		{"at end", n, 10},
		{"at end to end", n, -1},
		{"beyond end", 5 * n, 10},
		{"zero length", 10, 0},
		{"zero length at 0", 0, 0},
	} {
		got, err := readRange(ctx, st, "rng/obj", tc.off, tc.length)
		require.NoError(t, err, "%s: range [%d, +%d)", tc.name, tc.off, tc.length)
		require.True(t, bytes.Equal(sliceRef(ref, tc.off, tc.length), got), "%s: range [%d, +%d) read %d bytes that differ from the reference", tc.name, tc.off, tc.length, len(got))
	}
	counter := instrument.Wrap(st.Driver())
	_, err := readRange(ctx, st.WithDriver(counter), "rng/obj", -1, 10)
	require.ErrorIs(t, err, backend.ErrInvalidKey, "a negative offset must be refused")
	require.Zero(t, counter.Total(), "a negative offset is refused before the driver")

	buf := make([]byte, 20)
	require.NoError(t, st.ReadRange(ctx, "rng/obj", n-20, buf))
	require.Equal(t, ref[n-20:], buf)
	err = st.ReadRange(ctx, "rng/obj", n-10, buf)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "ReadRange past the end")

	seed := mrand.Uint64()
	rng := mrand.New(mrand.NewPCG(seed, 1))
	for i := range 40 {
		off := rng.Int64N(n + 50)
		length := rng.Int64N(3000) - 100 // some negative: to the end
		if length < 0 {
			length = -1
		}
		got, err := readRange(ctx, st, "rng/obj", off, length)
		require.NoError(t, err, "random range %d [%d, +%d) (seed %d)", i, off, length, seed)
		require.True(t, bytes.Equal(sliceRef(ref, off, length), got), "random range %d [%d, +%d) (seed %d) differs", i, off, length, seed)
	}
}

// sliceRef is the reference answer of a ranged read.
func sliceRef(ref []byte, off, length int64) []byte {
	if off >= int64(len(ref)) {
		return []byte{}
	}
	end := int64(len(ref))
	if length >= 0 && off+length < end {
		end = off + length
	}
	return ref[off:end]
}

// listKeys are keys whose order is easy to get wrong: bytes below '/'
// (space, '!', '-', '.') sort before a "directory", multi-byte UTF-8 sorts
// after ASCII, plus deep nesting. No key is both an object and a prefix of
// another ("a" and "a/b"), which file systems cannot hold.
var listKeys = []string{
	"a b", "a!", "a-", "a.b", "a/b!", "a/b c", "a/b-", "a/b.c", "a/b/c/d/e/f/g/h", "a/b/c/d/e/f/g/i",
	"a/b0", "a0", "ab/c", "b", "z/ü", "z/日本語", "~tilde", "é", "deep/1/2/3/4/5/6/7/8/9/10",
	"deep/1/2/3/x", "deep/1-2", "deep/1.2", "deep/10", "A", "a/b/c/d!",
}

// caseListSorted: List returns every key once, in byte order (as
// sort.Strings), relative to the store, with sizes, for the whole store
// and for directory and partial-segment prefixes.
func caseListSorted(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	want := slices.Clone(listKeys)
	sort.Strings(want)
	for i, k := range listKeys {
		put(t, st, k, pattern(uint64(i), i))
	}
	got := map[string]int64{}
	var order []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error {
		order = append(order, o.Key)
		got[o.Key] = o.Size
		return nil
	}))
	require.Equal(t, want, order, "List must return every key once, in byte order")
	for i, k := range listKeys {
		require.Equal(t, int64(i), got[k], "listed size of %q", k)
	}
	for _, prefix := range []string{"a", "a/", "a/b", "a/b/", "a/b/c/d/e/f/g/", "deep/1", "deep/1/", "z/", "é", "nothing", "nothing/", "a/b/c/d/e/f/g/h"} {
		exp := []string{}
		for _, k := range want {
			if strings.HasPrefix(k, prefix) {
				exp = append(exp, k)
			}
		}
		require.Equal(t, exp, keys(t, st, prefix), "List(%q)", prefix)
	}
}

// caseListCancel: a listing whose callback cancels the context stops
// calling back at once and returns an error matching context.Canceled; a
// callback error is returned as is.
func caseListCancel(t T, s *storeEnv) {
	st := s.st
	for i := range 10 {
		put(t, st, fmt.Sprintf("lc/%02d", i), []byte{byte(i)})
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	calls := 0
	start := time.Now()
	err := st.List(ctx, "lc/", func(backend.ObjectInfo) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return nil
	})
	require.ErrorIs(t, err, context.Canceled, "List cancelled from its callback")
	require.Equal(t, 3, calls, "no callback after cancellation")
	require.Less(t, time.Since(start), 10*time.Second, "a cancelled List must return promptly")

	errStop := errors.New("stop here")
	calls = 0
	err = st.List(t.Context(), "lc/", func(backend.ObjectInfo) error {
		calls++
		if calls == 5 {
			return errStop
		}
		return nil
	})
	require.ErrorIs(t, err, errStop, "List returns the callback's error")
	require.Equal(t, 5, calls)
}

// invalidKeys try to escape the store or are not clean keys.
var invalidKeys = []string{"", "../x", "..", "a/../../x", "a/..", "/abs", "//abs", `\abs`, "a//b", "a/./b", "./a", ".", "a/", "a\x00b", "\x00", "\xff", "a/\xc3", "bad-\xed\xa0\x80-surrogate", "\xc0\xaf"}

// subCleans are the invalid keys Sub accepts as prefixes: surrounding
// slashes are trimmed from a prefix, and "" is the store itself.
var subCleans = map[string]bool{"": true, "a/": true, "/abs": true, "//abs": true}

// caseInvalidKeys: keys that try to escape (.., absolute, NUL) or are not
// clean fail with ErrInvalidKey on every operation, before reaching the
// driver, and nothing is written.
func caseInvalidKeys(t T, s *storeEnv) {
	ctx := t.Context()
	counter := instrument.Wrap(s.st.Driver())
	st := s.st.WithDriver(counter)
	for _, k := range invalidKeys {
		err := st.PutBytes(ctx, k, []byte("escape"), backend.PutOptions{})
		require.ErrorIs(t, err, backend.ErrInvalidKey, "Put(%q)", k)
		_, err = st.Stat(ctx, k)
		require.ErrorIs(t, err, backend.ErrInvalidKey, "Stat(%q)", k)
		_, err = readRange(ctx, st, k, 0, -1)
		require.ErrorIs(t, err, backend.ErrInvalidKey, "NewRangeReader(%q)", k)
		require.ErrorIs(t, st.Delete(ctx, k), backend.ErrInvalidKey, "Delete(%q)", k)
		if !subCleans[k] {
			_, err = st.Sub(k)
			require.ErrorIs(t, err, backend.ErrInvalidKey, "Sub(%q)", k)
		}
	}
	for _, p := range []string{"../", "/abs/", "a//", "a\x00/"} {
		err := st.List(ctx, p, func(backend.ObjectInfo) error { return nil })
		require.ErrorIs(t, err, backend.ErrInvalidKey, "List(%q)", p)
	}
	require.Zero(t, counter.Total(), "invalid keys must never reach the driver")
	require.Empty(t, keys(t, s.st, ""), "nothing may be written by refused keys")
}

// caseSubIsolation: two Sub stores of one store hold the same key
// independently; each lists only its own objects, with keys relative to
// it; deleting in one leaves the other; the parent sees both below their
// prefixes.
func caseSubIsolation(t T, s *storeEnv) {
	ctx := t.Context()
	pa, pb := subName(), subName()
	a, err := s.st.Sub(pa)
	require.NoError(t, err)
	b, err := s.st.Sub(pb)
	require.NoError(t, err)
	put(t, a, "k", []byte("in a"))
	put(t, b, "k", []byte("in b, longer"))
	put(t, b, "only-b", []byte("b"))
	requireContent(t, a, "k", []byte("in a"))
	requireContent(t, b, "k", []byte("in b, longer"))
	requireNotFound(t, a, "only-b", "an object of a sibling Sub store")
	require.Equal(t, []string{"k"}, keys(t, a, ""), "Sub store lists only its own keys")
	require.Equal(t, []string{"k", "only-b"}, keys(t, b, ""))
	want := []string{pa + "/k", pb + "/k", pb + "/only-b"}
	sort.Strings(want)
	require.Equal(t, want, keys(t, s.st, ""), "the parent sees both Sub stores' keys under their prefixes")
	require.NoError(t, a.Delete(ctx, "k"))
	requireContent(t, b, "k", []byte("in b, longer"), "deleting in one Sub store must not touch another")

	// A nested prefix given with a trailing slash: the driver sees the
	// whole prefix, and the store's URL ends with it.
	nested := pa + "/x/y"
	c, err := s.st.Sub(nested + "/")
	require.NoError(t, err)
	counter := instrument.Wrap(c.Driver())
	put(t, c.WithDriver(counter), "k", []byte("nested"))
	require.Equal(t, int64(1), counter.CountKey(instrument.OpPut, s.st.Prefix()+nested+"/k"), "the driver must get the full prefixed key")
	path, _, _ := strings.Cut(c.String(), "?") // the store's non-secret options follow
	require.True(t, strings.HasSuffix(path, "/"+nested), "URL %q of Sub(%q/)", c.String(), nested)
	requireContent(t, s.st, nested+"/k", []byte("nested"))
	requireNotFound(t, s.st, "k", "a Sub store's key seen from the parent without its prefix")
}

// caseLargeObject: an object of several parts, streamed from a generator
// (never held in memory) with its CRC32C declared, reads back with the
// same size and CRC, and ranges across part boundaries match.
func caseLargeObject(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	size := s.size
	caps := st.Capabilities()
	part := caps.PartSize
	if caps.Multipart && part > 0 {
		if floor := 2*part + part/2; size < floor {
			size = floor
		}
		t.Logf("multipart driver: part size %d, concurrency %d, object %d bytes", part, caps.Concurrency, size)
	} else {
		part = 5 << 20
	}
	size += 12345 // not a multiple of any part size
	const seed = 0xc0ffee
	sum := streamCRC(seed, size)

	start := time.Now()
	require.NoError(t, st.Put(ctx, "large/obj", size, detbytes.NewReader(seed, size), backend.PutOptions{CRC32C: &sum}), "Put of %d bytes", size)
	t.Logf("wrote %d bytes in %v", size, time.Since(start))
	a, err := st.Stat(ctx, "large/obj")
	require.NoError(t, err)
	require.Equal(t, size, a.Size, "stat size")
	if a.CRC32C != nil {
		require.Equal(t, sum, *a.CRC32C, "stored CRC32C")
	}

	rc, err := st.NewRangeReader(ctx, "large/obj", 0, -1)
	require.NoError(t, err)
	back := crc32c.New()
	n, err := io.Copy(back, rc)
	rc.Close()
	require.NoError(t, err, "read back")
	require.Equal(t, size, n, "bytes read back")
	require.Equal(t, sum, back.Sum32(), "CRC32C of the bytes read back")

	for _, off := range []int64{0, part - 3, part, 2*part - 1, size - 4000, size - 1} {
		if off < 0 || off >= size {
			continue
		}
		got, err := readRange(ctx, st, "large/obj", off, 4096)
		require.NoError(t, err, "range at %d", off)
		want := make([]byte, min(4096, size-off))
		detbytes.Fill(want, seed, off)
		require.True(t, bytes.Equal(want, got), "range at %d (part size %d) differs", off, part)
	}
	require.NoError(t, st.Delete(ctx, "large/obj"))
}

// caseConcurrent: 8 goroutines write 8 objects each (4 x 4 in short
// mode), then overwrite them while as many readers read random objects: a
// reader sees either the whole old or the whole new object, never a mix;
// at the end every object holds its new content and the listing has them
// all, sorted.
func caseConcurrent(t T, s *storeEnv) {
	ctx := t.Context()
	st := s.st
	workers, objects := 8, 8
	if s.short {
		workers, objects = 4, 4
	}
	key := func(w, o int) string { return fmt.Sprintf("conc/w%d/o%d", w, o) }
	v1 := func(w, o int) []byte { return pattern(uint64(w*100+o), 1000+(w*objects+o)*397) }
	v2 := func(w, o int) []byte { return pattern(uint64(w*100+o+50), 20_000-(w*objects+o)*131) }

	errs := make(chan error, 2*workers*objects*4)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for o := range objects {
				if err := st.PutBytes(ctx, key(w, o), v1(w, o), backend.PutOptions{}); err != nil {
					errs <- fmt.Errorf("put %s: %w", key(w, o), err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	errs = make(chan error, workers*objects*8)
	done := make(chan struct{})
	var readers sync.WaitGroup
	for r := range workers {
		readers.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(r), 7))
			for i := 0; ; i++ {
				select {
				case <-done:
					if i > 0 {
						return
					}
				default:
				}
				w, o := rng.IntN(workers), rng.IntN(objects)
				got, err := st.ReadAll(ctx, key(w, o), 0)
				if err != nil {
					errs <- fmt.Errorf("read %s during overwrites: %w", key(w, o), err)
					return
				}
				if !bytes.Equal(got, v1(w, o)) && !bytes.Equal(got, v2(w, o)) {
					errs <- fmt.Errorf("read %s during overwrites: %d bytes that are neither the old nor the new object", key(w, o), len(got))
					return
				}
			}
		})
	}
	for w := range workers {
		wg.Go(func() {
			for o := range objects {
				if err := st.PutBytes(ctx, key(w, o), v2(w, o), backend.PutOptions{}); err != nil {
					errs <- fmt.Errorf("overwrite %s: %w", key(w, o), err)
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var want []string
	for w := range workers {
		for o := range objects {
			requireContent(t, st, key(w, o), v2(w, o))
			want = append(want, key(w, o))
		}
	}
	sort.Strings(want)
	require.Equal(t, want, keys(t, st, "conc/"))
}

// caseWrongCRC32C: with Capabilities().ServerCRC32C, a write whose
// declared CRC32C does not match its body fails and publishes nothing.
// Without it the case is skipped: a declared CRC32C is then only a hint.
func caseWrongCRC32C(t T, s *storeEnv) {
	requireWrongCRCRefused(t, s.st, 7, 300_000)
}

// caseWrongCRC32CMultipart is caseWrongCRC32C for a body that goes
// through the multipart (resumable) path; skipped without one.
func caseWrongCRC32CMultipart(t T, s *storeEnv) {
	size, _ := multipartBody(s.st)
	if size == 0 {
		t.Skip("backend does not declare Capabilities().Multipart with a PartSize")
	}
	requireWrongCRCRefused(t, s.st, size)
}

func requireWrongCRCRefused(t T, st *backend.Store, sizes ...int64) {
	t.Helper()
	if !st.Capabilities().ServerCRC32C {
		t.Skip("backend does not declare Capabilities().ServerCRC32C (declared checksums are not verified on upload)")
	}
	old := pattern(20, 500)
	put(t, st, "crc/old", old)
	for _, size := range sizes {
		bad := streamCRC(21, size) ^ 1
		for _, key := range []string{"crc/old", "crc/new"} {
			err := st.Put(t.Context(), key, size, detbytes.NewReader(21, size), backend.PutOptions{CRC32C: &bad})
			require.Error(t, err, "Put of %q (%d bytes) declaring a wrong CRC32C", key, size)
		}
	}
	requireContent(t, st, "crc/old", old, "a write with a wrong CRC32C must leave the old object")
	requireNotFound(t, st, "crc/new", "a write with a wrong CRC32C must publish nothing")
}

// caseCancelledCalls: every call made with an already cancelled context
// fails with context.Canceled and changes nothing.
func caseCancelledCalls(t T, s *storeEnv) {
	st := s.st
	put(t, st, "cc/obj", []byte("data"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := st.Stat(ctx, "cc/obj")
	require.ErrorIs(t, err, context.Canceled, "Stat")
	_, err = readRange(ctx, st, "cc/obj", 0, -1)
	require.ErrorIs(t, err, context.Canceled, "NewRangeReader")
	_, err = st.ReadAll(ctx, "cc/obj", 0)
	require.ErrorIs(t, err, context.Canceled, "ReadAll")
	_, err = st.Exists(ctx, "cc/obj")
	require.ErrorIs(t, err, context.Canceled, "Exists")
	calls := 0
	err = st.List(ctx, "", func(backend.ObjectInfo) error { calls++; return nil })
	require.ErrorIs(t, err, context.Canceled, "List")
	require.Zero(t, calls, "List with a cancelled context must not call back")
	require.ErrorIs(t, st.Delete(ctx, "cc/obj"), context.Canceled, "Delete")
	requireContent(t, st, "cc/obj", []byte("data"), "calls with a cancelled context change nothing")
}

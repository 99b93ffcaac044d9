package backend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/backend/mem"
)

// factory opens a fresh, empty Store for one test.
type factory struct {
	name string
	open func(t *testing.T) *backend.Store
}

var memSeq atomic.Int64

func factories() []factory {
	return []factory{
		{"fs", func(t *testing.T) *backend.Store {
			// A plain path: ParseURL turns it into a file:// URL.
			return openStore(t, t.TempDir()+"/root")
		}},
		{"mem", func(t *testing.T) *backend.Store {
			name := fmt.Sprintf("backendtest%d", memSeq.Add(1))
			t.Cleanup(func() { mem.Reset(name) })
			// A prefix in the URL, so driver keys differ from store keys.
			return openStore(t, "mem://"+name+"/run/7")
		}},
	}
}

func openStore(t *testing.T, url string) *backend.Store {
	t.Helper()
	s, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// eachStore runs f as a subtest against every backend.
func eachStore(t *testing.T, f func(t *testing.T, s *backend.Store)) {
	for _, fac := range factories() {
		t.Run(fac.name, func(t *testing.T) { f(t, fac.open(t)) })
	}
}

func put(t *testing.T, s *backend.Store, key, data string) {
	t.Helper()
	require.NoError(t, s.PutBytes(context.Background(), key, []byte(data), backend.PutOptions{}))
}

func readAll(t *testing.T, s *backend.Store, key string) string {
	t.Helper()
	b, err := s.ReadAll(context.Background(), key, 0)
	require.NoError(t, err)
	return string(b)
}

func requireMissing(t *testing.T, s *backend.Store, key string) {
	t.Helper()
	_, err := s.Stat(context.Background(), key)
	require.ErrorIs(t, err, backend.ErrNotFound)
}

func listKeys(t *testing.T, s *backend.Store, prefix string) []string {
	t.Helper()
	keys := []string{}
	require.NoError(t, s.List(context.Background(), prefix, func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}))
	return keys
}

func TestRoundTrip(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		data := bytes.Repeat([]byte("ckptkit!"), 40000) // larger than one copy buffer
		require.NoError(t, s.PutBytes(ctx, "rank0/data.bin", data, backend.PutOptions{}))
		got, err := s.ReadAll(ctx, "rank0/data.bin", 0)
		require.NoError(t, err)
		assert.Equal(t, data, got)

		a, err := s.Stat(ctx, "rank0/data.bin")
		require.NoError(t, err)
		assert.Equal(t, int64(len(data)), a.Size)
		assert.False(t, a.ModTime.IsZero())

		ok, err := s.Exists(ctx, "rank0/data.bin")
		require.NoError(t, err)
		assert.True(t, ok)

		// Overwrite replaces the whole object.
		put(t, s, "rank0/data.bin", "short")
		assert.Equal(t, "short", readAll(t, s, "rank0/data.bin"))

		_, err = s.ReadAll(ctx, "rank0/data.bin", 3)
		assert.Error(t, err, "limit is enforced")
	})
}

func TestRangedReads(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		put(t, s, "r", "0123456789")
		cases := []struct {
			name           string
			offset, length int64
			want           string
		}{
			{"start", 0, 3, "012"},
			{"middle", 4, 3, "456"},
			{"to end", 7, -1, "789"},
			{"whole", 0, -1, "0123456789"},
			{"length past end", 8, 10, "89"},
			{"at end", 10, -1, ""},
			{"past end", 15, 5, ""},
			{"zero length", 3, 0, ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				rc, err := s.NewRangeReader(ctx, "r", c.offset, c.length)
				require.NoError(t, err)
				got, err := io.ReadAll(rc)
				require.NoError(t, err)
				require.NoError(t, rc.Close())
				assert.Equal(t, c.want, string(got))
			})
		}

		dst := make([]byte, 4)
		require.NoError(t, s.ReadRange(ctx, "r", 2, dst))
		assert.Equal(t, "2345", string(dst))
		err := s.ReadRange(ctx, "r", 8, dst)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)

		c := instrument.Wrap(s.Driver())
		_, err = s.WithDriver(c).NewRangeReader(ctx, "r", -1, 2)
		assert.Error(t, err)
		assert.Zero(t, c.Total(), "negative offset is refused before the driver")
	})
}

func TestNotFound(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		put(t, s, "dir/present", "x")
		for _, key := range []string{"absent", "dir/absent", "absent/deeper", "dir", "dir/present/deeper"} {
			_, err := s.Stat(ctx, key)
			assert.ErrorIs(t, err, backend.ErrNotFound, "stat %s", key)
			_, err = s.NewRangeReader(ctx, key, 0, -1)
			assert.ErrorIs(t, err, backend.ErrNotFound, "read %s", key)
			_, err = s.NewRangeReader(ctx, key, 5, 10)
			assert.ErrorIs(t, err, backend.ErrNotFound, "ranged read %s", key)
			_, err = s.ReadAll(ctx, key, 0)
			assert.ErrorIs(t, err, backend.ErrNotFound, "read all %s", key)
			ok, err := s.Exists(ctx, key)
			assert.NoError(t, err)
			assert.False(t, ok)
		}
		// The error names the object and matches no other sentinel.
		_, err := s.Stat(ctx, "absent")
		assert.Contains(t, err.Error(), "absent")
		assert.NotErrorIs(t, err, backend.ErrPermission)
		assert.False(t, backend.IsTransient(err))
	})
}

func TestDelete(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		require.NoError(t, s.Delete(ctx, "never-existed"))
		require.NoError(t, s.Delete(ctx, "no/such/dir/key"))
		put(t, s, "a/b/c", "1")
		put(t, s, "a/d", "2")
		require.NoError(t, s.Delete(ctx, "a/b/c"))
		requireMissing(t, s, "a/b/c")
		assert.Equal(t, "2", readAll(t, s, "a/d"))
		require.NoError(t, s.Delete(ctx, "a/b/c"), "second delete")
		assert.Equal(t, []string{"a/d"}, listKeys(t, s, ""))
		// The key can be written again after its directory went away.
		put(t, s, "a/b/c", "3")
		assert.Equal(t, "3", readAll(t, s, "a/b/c"))
	})
}

func TestZeroLength(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		put(t, s, "empty", "")
		a, err := s.Stat(ctx, "empty")
		require.NoError(t, err)
		assert.Zero(t, a.Size)
		assert.Equal(t, "", readAll(t, s, "empty"))
		rc, err := s.NewRangeReader(ctx, "empty", 0, 10)
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.Empty(t, b)
		require.NoError(t, rc.Close())

		var infos []backend.ObjectInfo
		require.NoError(t, s.List(ctx, "", func(o backend.ObjectInfo) error {
			infos = append(infos, o)
			return nil
		}))
		require.Len(t, infos, 1)
		assert.Equal(t, "empty", infos[0].Key)
		assert.Zero(t, infos[0].Size)
	})
}

var errBoom = errors.New("boom")

// failingReader delivers n bytes of 'x' and then fails with errBoom.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errBoom
	}
	k := min(len(p), r.n)
	for i := range p[:k] {
		p[i] = 'x'
	}
	r.n -= k
	return k, nil
}

func TestFailedSourceNeverPublishes(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		put(t, s, "obj", "old")
		for _, key := range []string{"obj", "fresh/obj"} {
			err := s.Put(ctx, key, 200000, &failingReader{n: 100000}, backend.PutOptions{})
			require.ErrorIs(t, err, errBoom)
			assert.False(t, backend.IsTransient(err))
		}
		assert.Equal(t, "old", readAll(t, s, "obj"))
		requireMissing(t, s, "fresh/obj")
		assert.Equal(t, []string{"obj"}, listKeys(t, s, ""), "no temporary object is visible")
	})
}

func TestSizeMismatch(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		put(t, s, "obj", "old")
		for _, c := range []struct {
			name string
			size int64
			data string
		}{{"short", 10, "12345"}, {"long", 5, "1234567890"}, {"empty source", 1, ""}} {
			t.Run(c.name, func(t *testing.T) {
				for _, key := range []string{"obj", "new"} {
					// A plain reader (not a Seeker) and a rewindable one.
					err := s.Put(ctx, key, c.size, io.MultiReader(strings.NewReader(c.data)), backend.PutOptions{})
					assert.ErrorIs(t, err, backend.ErrSizeMismatch)
					err = s.Put(ctx, key, c.size, strings.NewReader(c.data), backend.PutOptions{})
					assert.ErrorIs(t, err, backend.ErrSizeMismatch)
				}
				assert.Equal(t, "old", readAll(t, s, "obj"))
				requireMissing(t, s, "new")
			})
		}
		// Negative sizes are refused before the driver.
		c := instrument.Wrap(s.Driver())
		err := s.WithDriver(c).Put(ctx, "new", -1, strings.NewReader(""), backend.PutOptions{})
		assert.ErrorIs(t, err, backend.ErrSizeMismatch)
		assert.Zero(t, c.Total())
	})
}

// cancellingReader cancels its context after delivering its first block and
// keeps delivering data afterwards.
type cancellingReader struct {
	cancel context.CancelFunc
	n      int
}

func (r *cancellingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, 4096)
	for i := range p[:k] {
		p[i] = 'y'
	}
	r.n -= k
	r.cancel()
	return k, nil
}

func TestCancelledPutPublishesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		put(t, s, "obj", "old")

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := s.PutBytes(ctx, "obj", []byte("new"), backend.PutOptions{})
		require.ErrorIs(t, err, context.Canceled)
		err = s.PutBytes(ctx, "fresh", []byte("new"), backend.PutOptions{})
		require.ErrorIs(t, err, context.Canceled)

		// Cancelled while the body streams.
		for _, key := range []string{"obj", "fresh"} {
			ctx, cancel := context.WithCancel(context.Background())
			err := s.Put(ctx, key, 100000, &cancellingReader{cancel: cancel, n: 100000}, backend.PutOptions{})
			require.ErrorIs(t, err, context.Canceled)
		}

		assert.Equal(t, "old", readAll(t, s, "obj"))
		requireMissing(t, s, "fresh")
		assert.Equal(t, []string{"obj"}, listKeys(t, s, ""))
	})
}

func TestCancelledCalls(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		put(t, s, "obj", "data")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Stat(ctx, "obj")
		assert.ErrorIs(t, err, context.Canceled)
		_, err = s.NewRangeReader(ctx, "obj", 0, -1)
		assert.ErrorIs(t, err, context.Canceled)
		err = s.List(ctx, "", func(backend.ObjectInfo) error { return nil })
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, s.Delete(ctx, "obj"), context.Canceled)
		assert.Equal(t, "data", readAll(t, s, "obj"))
	})
}

func TestCreateIfAbsent(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		require.True(t, s.Capabilities().CreateIfAbsent)
		once := backend.PutOptions{IfNotExists: true}
		require.NoError(t, s.PutBytes(ctx, "meta/.metadata", []byte("first"), once))
		err := s.PutBytes(ctx, "meta/.metadata", []byte("second"), once)
		require.ErrorIs(t, err, backend.ErrAlreadyExists)
		assert.Equal(t, "first", readAll(t, s, "meta/.metadata"))
		// A plain write still overwrites.
		put(t, s, "meta/.metadata", "third")
		assert.Equal(t, "third", readAll(t, s, "meta/.metadata"))
		assert.Equal(t, []string{"meta/.metadata"}, listKeys(t, s, ""))
	})
}

func TestConcurrentCreators(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				body := []byte(fmt.Sprintf("creator-%d", i))
				errs[i] = s.PutBytes(ctx, "commit", body, backend.PutOptions{IfNotExists: true})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "two creators won")
				winner = i
				continue
			}
			require.ErrorIs(t, err, backend.ErrAlreadyExists)
		}
		require.NotEqual(t, -1, winner, "nobody won")
		assert.Equal(t, fmt.Sprintf("creator-%d", winner), readAll(t, s, "commit"))
		assert.Equal(t, []string{"commit"}, listKeys(t, s, ""))
	})
}

// oddKeys sort differently per directory than as whole keys: ' ', '!', '-'
// and '.' sort before '/'.
var oddKeys = []string{
	"a b", "ü", "a/b/c/d/e", "a-", "a.b", "a0", "a/b!x", "a/b-", "a/b0",
	"A", "~", "z/ü", "b", "ab/c", "a/b/c/d!", "a/b/c/d/e0",
}

func TestListSorted(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		for i, k := range oddKeys {
			put(t, s, k, strings.Repeat("x", i))
		}
		want := append([]string(nil), oddKeys...)
		sort.Strings(want)
		assert.Equal(t, want, listKeys(t, s, ""))

		for _, prefix := range []string{"a", "a/", "a/b", "a/b/", "a/b/c/d/", "z/", "nothing/", "nothing"} {
			exp := []string{}
			for _, k := range want {
				if strings.HasPrefix(k, prefix) {
					exp = append(exp, k)
				}
			}
			assert.Equal(t, exp, listKeys(t, s, prefix), "prefix %q", prefix)
		}

		// Sizes come with the listing.
		require.NoError(t, s.List(ctx, "a/b0", func(o backend.ObjectInfo) error {
			assert.Equal(t, "a/b0", o.Key)
			assert.Equal(t, int64(8), o.Size)
			return nil
		}))

		// The callback's error stops the listing and comes back unchanged.
		stop := errors.New("stop")
		var seen int
		err := s.List(ctx, "", func(backend.ObjectInfo) error {
			seen++
			if seen == 3 {
				return stop
			}
			return nil
		})
		assert.ErrorIs(t, err, stop)
		assert.Equal(t, 3, seen)
	})
}

func TestInvalidKeysNeverReachDriver(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		c := instrument.Wrap(s.Driver())
		is := s.WithDriver(c)
		// "a/" is not a key either: it has an empty last segment.
		for _, key := range []string{"../x", "/abs", "a//b", "a/./b", "a\x00b", "", ".", "..", "a/..", "a/", `\abs`} {
			_, err := is.Stat(ctx, key)
			assert.ErrorIs(t, err, backend.ErrInvalidKey, "stat %q", key)
			_, err = is.NewRangeReader(ctx, key, 0, -1)
			assert.ErrorIs(t, err, backend.ErrInvalidKey, "read %q", key)
			err = is.PutBytes(ctx, key, []byte("x"), backend.PutOptions{})
			assert.ErrorIs(t, err, backend.ErrInvalidKey, "put %q", key)
			err = is.Delete(ctx, key)
			assert.ErrorIs(t, err, backend.ErrInvalidKey, "delete %q", key)
		}
		for _, prefix := range []string{"../", "/abs/", "a//"} {
			err := is.List(ctx, prefix, func(backend.ObjectInfo) error { return nil })
			assert.ErrorIs(t, err, backend.ErrInvalidKey, "list %q", prefix)
		}
		_, err := is.Sub("../up")
		assert.ErrorIs(t, err, backend.ErrInvalidKey)
		assert.Zero(t, c.Total(), "the driver saw an invalid key")
		assert.Empty(t, listKeys(t, s, ""))
	})
}

func TestSubIsolates(t *testing.T) {
	eachStore(t, func(t *testing.T, s *backend.Store) {
		ctx := context.Background()
		run1, err := s.Sub("ckpt/run1")
		require.NoError(t, err)
		run2, err := s.Sub("ckpt/run2/")
		require.NoError(t, err)

		c := instrument.Wrap(s.Driver())
		run1c := run1.WithDriver(c)
		put(t, run1c, "k", "one")
		put(t, run2, "k", "two")
		assert.Equal(t, int64(1), c.CountKey(instrument.OpPut, s.Prefix()+"ckpt/run1/k"))

		assert.Equal(t, "one", readAll(t, run1, "k"))
		assert.Equal(t, "two", readAll(t, run2, "k"))
		assert.Equal(t, "one", readAll(t, s, "ckpt/run1/k"))
		requireMissing(t, s, "k")
		assert.Equal(t, []string{"k"}, listKeys(t, run1, ""))
		assert.Equal(t, []string{"ckpt/run1/k", "ckpt/run2/k"}, listKeys(t, s, ""))
		assert.True(t, strings.HasSuffix(run1.String(), "/ckpt/run1"), run1.String())

		require.NoError(t, run1.Delete(ctx, "k"))
		assert.Equal(t, "two", readAll(t, run2, "k"))
	})
}

func TestUnknownScheme(t *testing.T) {
	_, err := backend.Open(context.Background(), "nope://bucket/x")
	require.ErrorIs(t, err, backend.ErrUnknownScheme)
	for _, s := range []string{"file", "mem"} {
		assert.Contains(t, backend.Schemes(), s)
		assert.Contains(t, err.Error(), s)
	}
}

func TestCredentialsNeverInErrors(t *testing.T) {
	ctx := context.Background()
	for _, url := range []string{
		"s3://AKIDUSER:supersecret@bucket/x",
		"nope://user:supersecret@host/x?token=supersecret",
		"mem://user:supersecret@name/x",
		"s3://bucket/x?secret_key=supersecret",
		"s3://user:supersecret@bucket/%zz",
	} {
		s, err := backend.Open(ctx, url)
		if err != nil {
			assert.NotContains(t, err.Error(), "supersecret", url)
			continue
		}
		// A backend that opened must still keep the secret out of messages.
		assert.NotContains(t, s.String(), "supersecret")
		_, err = s.Stat(ctx, "absent")
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "supersecret")
		_ = s.Close()
	}
}

// Regression: a mem:// store without a bucket name printed its URLs as
// "mem:/x/k", which Open would then read as a local path.
func TestBucketlessURLKeepsItsSlashes(t *testing.T) {
	st, err := backend.Open(context.Background(), "mem://")
	require.NoError(t, err)
	sub, err := st.Sub("x")
	require.NoError(t, err)
	require.Equal(t, "mem:///x/k", sub.URL("k"))
}

// bodyIgnoringDriver publishes empty objects without reading their body, as
// the S3 driver legitimately does.
type bodyIgnoringDriver struct{ backend.Driver }

func (d bodyIgnoringDriver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if size == 0 {
		return d.Driver.Put(ctx, key, 0, strings.NewReader(""), opts)
	}
	return d.Driver.Put(ctx, key, size, r, opts)
}

// Regression (found by the conformance suite on S3): declaring 0 bytes and
// delivering 3 published an empty object when the driver never read the body.
func TestDeclaredEmptyButLongSourceIsRefused(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://")
	require.NoError(t, err)
	st = st.WithDriver(bodyIgnoringDriver{st.Driver()})
	err = st.Put(ctx, "k", 0, strings.NewReader("abc"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrSizeMismatch)
	ok, err := st.Exists(ctx, "k")
	require.NoError(t, err)
	require.False(t, ok)
}

// ctxDeafDriver ignores the caller's context, like an HTTP client that
// only notices a cancellation when the response arrives.
type ctxDeafDriver struct{ backend.Driver }

func (d ctxDeafDriver) Put(_ context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	return d.Driver.Put(context.Background(), key, size, r, opts)
}

// cancelHalfway cancels its context after delivering half of data.
type cancelHalfway struct {
	data   []byte
	pos    int
	cancel context.CancelFunc
}

func (c *cancelHalfway) Read(p []byte) (int, error) {
	if c.pos >= len(c.data) {
		return 0, io.EOF
	}
	if c.pos >= len(c.data)/2 {
		c.cancel()
	}
	n := copy(p[:min(len(p), 1024)], c.data[c.pos:])
	c.pos += n
	return n, nil
}

// Regression (found by the conformance suite on S3): a write cancelled
// midway was published when the driver sent the rest of the body anyway.
func TestCancelledMidBodyNeverPublishes(t *testing.T) {
	st, err := backend.Open(context.Background(), "mem://")
	require.NoError(t, err)
	st = st.WithDriver(ctxDeafDriver{st.Driver()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := bytes.Repeat([]byte("x"), 64<<10)
	err = st.Put(ctx, "k", int64(len(body)), &cancelHalfway{data: body, cancel: cancel}, backend.PutOptions{})
	require.ErrorIs(t, err, context.Canceled)
	ok, err := st.Exists(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, ok)
}

// Regression (review): two URL shapes printed their secrets: one that does
// not parse, and a secret whose value is badly escaped.
func TestRedactURLNeverLeaks(t *testing.T) {
	for _, raw := range []string{
		"s3://b/%zz?token=HUNTER2",
		"foo://x/run?secret=HUNTER2%zz",
		"gs://b/run?token=HUNTER2%zz&x=1",
		"s3://user:HUNTER2@b/run",
		"s3://b/run?X-Amz-Signature=HUNTER2&endpoint=h:1",
	} {
		require.NotContains(t, backend.RedactURL(raw), "HUNTER2", raw)
		_, err := backend.Open(context.Background(), raw)
		if err != nil {
			require.NotContains(t, err.Error(), "HUNTER2", raw)
		}
	}
	require.Equal(t, "s3://b/run?endpoint=h:1", backend.RedactURL("s3://b/run?endpoint=h:1"))
}

//go:build unix

package host_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/plugins/host"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sha256File(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func randomBytes(n int, seed uint64) []byte { return detbytes.Bytes(seed, n) }

func crc(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

func open(t testing.TB, url string) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

func TestDiscoverAndRoundTrip(t *testing.T) { bothPaths(t, testDiscoverAndRoundTrip) }

func testDiscoverAndRoundTrip(t *testing.T, streaming bool) {
	dir := pluginDir(t, "memplugin")
	sum := sha256File(t, filepath.Join(dir, "memplugin"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, host.LockFileName), []byte("# pins\n"+sum+"  memplugin\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("not a plugin"), 0o644))

	ps := discover(t, host.Config{Dir: dir, RequirePins: true, ForceStreaming: streaming})
	require.Len(t, ps, 1)
	p := ps[0]
	assert.Equal(t, "memplugin", p.Name)
	assert.Equal(t, "0.1.0", p.Version)
	assert.Equal(t, []string{"memplug"}, p.Schemes)
	assert.Equal(t, sum, p.SHA256)
	assert.True(t, p.Pinned)
	assert.NotZero(t, p.PID())
	assert.Contains(t, backend.Schemes(), "memplug")

	ctx := context.Background()
	st := open(t, "memplug://bucket/prefix")
	assert.Equal(t, "memplug://bucket/prefix", st.String())
	assert.True(t, st.Capabilities().CreateIfAbsent)

	data := []byte("0123456789abcdefghij")
	require.NoError(t, st.PutBytes(ctx, "a/obj", data, backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "a/obj", 0)
	require.NoError(t, err)
	assert.Equal(t, data, got)

	// Ranged reads: middle, to the end, past the end.
	buf := make([]byte, 5)
	require.NoError(t, st.ReadRange(ctx, "a/obj", 3, buf))
	assert.Equal(t, "34567", string(buf))
	for _, tc := range []struct {
		off, n int64
		want   string
	}{{15, -1, "fghij"}, {18, 10, "ij"}, {20, 5, ""}, {100, -1, ""}, {0, 0, ""}} {
		rc, err := st.NewRangeReader(ctx, "a/obj", tc.off, tc.n)
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
		assert.Equal(t, tc.want, string(b), "range %d+%d", tc.off, tc.n)
	}

	attrs, err := st.Stat(ctx, "a/obj")
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), attrs.Size)
	require.NotNil(t, attrs.CRC32C)
	assert.Equal(t, crc(data), *attrs.CRC32C)
	assert.WithinDuration(t, time.Now(), attrs.ModTime, time.Minute)

	// Not found, through errors.Is, on every call that can say so.
	_, err = st.ReadAll(ctx, "missing", 0)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.Stat(ctx, "missing")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 0, -1)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	assert.NoError(t, st.Delete(ctx, "missing"))

	// Create-if-absent and empty objects.
	err = st.PutBytes(ctx, "a/obj", []byte("x"), backend.PutOptions{IfNotExists: true})
	assert.ErrorIs(t, err, backend.ErrAlreadyExists)
	require.NoError(t, st.PutBytes(ctx, "empty", nil, backend.PutOptions{IfNotExists: true}))
	got, err = st.ReadAll(ctx, "empty", 0)
	require.NoError(t, err)
	assert.Empty(t, got)

	// Sorted listing below the store's prefix only.
	other := open(t, "memplug://bucket/other")
	require.NoError(t, other.PutBytes(ctx, "zzz", []byte("z"), backend.PutOptions{}))
	for _, k := range []string{"b/2", "b/1", "a/x/y", "c"} {
		require.NoError(t, st.PutBytes(ctx, k, []byte(k), backend.PutOptions{}))
	}
	var keys []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil }))
	assert.Equal(t, []string{"a/obj", "a/x/y", "b/1", "b/2", "c", "empty"}, keys)
	keys = nil
	require.NoError(t, st.List(ctx, "b/", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil }))
	assert.Equal(t, []string{"b/1", "b/2"}, keys)
	stop := errors.New("stop")
	n := 0
	err = st.List(ctx, "", func(backend.ObjectInfo) error { n++; return stop })
	assert.ErrorIs(t, err, stop)
	assert.Equal(t, 1, n)

	// A second store on the same bucket sees the data; delete works.
	again := open(t, "memplug://bucket/prefix")
	require.NoError(t, again.Delete(ctx, "c"))
	_, err = st.Stat(ctx, "c")
	assert.ErrorIs(t, err, backend.ErrNotFound)

	// Size enforcement and key validation survive the process boundary.
	err = st.Put(ctx, "short", 10, strings.NewReader("abc"), backend.PutOptions{})
	assert.ErrorIs(t, err, backend.ErrSizeMismatch)
	_, err = st.Stat(ctx, "short")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.Stat(ctx, "../escape")
	assert.ErrorIs(t, err, backend.ErrInvalidKey)
	bad := uint32(1)
	err = st.PutBytes(ctx, "badcrc", []byte("abc"), backend.PutOptions{CRC32C: &bad})
	assert.Error(t, err)
	_, err = st.Stat(ctx, "badcrc")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestLargeObject(t *testing.T) { bothPaths(t, testLargeObject) }

func testLargeObject(t *testing.T, streaming bool) {
	discover(t, host.Config{Dir: pluginDir(t, "memplugin"), ForceStreaming: streaming})
	st := open(t, "memplug://large/run")
	ctx := context.Background()
	data := randomBytes(64<<20, 1)
	require.NoError(t, st.Put(ctx, "big", int64(len(data)), bytes.NewReader(data), backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "big", 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "64 MiB object differs after a round trip")
	attrs, err := st.Stat(ctx, "big")
	require.NoError(t, err)
	assert.Equal(t, crc(data), *attrs.CRC32C)
	part := make([]byte, 3<<20)
	require.NoError(t, st.ReadRange(ctx, "big", 40<<20+7, part))
	assert.True(t, bytes.Equal(data[40<<20+7:43<<20+7], part))
}

func TestCancelledRead(t *testing.T) { bothPaths(t, testCancelledRead) }

func testCancelledRead(t *testing.T, streaming bool) {
	discover(t, host.Config{Dir: pluginDir(t, "memplugin"), ForceStreaming: streaming})
	st := open(t, "memplug://cancel/r")
	require.NoError(t, st.PutBytes(context.Background(), "big", randomBytes(32<<20, 2), backend.PutOptions{}))
	ctx, cancel := context.WithCancel(context.Background())
	rc, err := st.NewRangeReader(ctx, "big", 0, -1)
	require.NoError(t, err)
	defer rc.Close()
	_, err = io.ReadFull(rc, make([]byte, 1<<20))
	require.NoError(t, err)
	cancel()
	start := time.Now()
	_, err = io.Copy(io.Discard, rc)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), 2*time.Second)

	// A deadline reaches the plugin too.
	dctx, dcancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer dcancel()
	_, err = st.Stat(dctx, "big")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// blockingSource delivers head, then blocks until release is closed (or,
// when ctx is set, until ctx is done), then fails.
type blockingSource struct {
	head    *bytes.Reader
	ctx     context.Context
	release chan struct{}
	reached chan struct{}
	once    atomic.Bool
}

func (s *blockingSource) Read(p []byte) (int, error) {
	if s.head.Len() > 0 {
		return s.head.Read(p)
	}
	if s.once.CompareAndSwap(false, true) {
		close(s.reached)
	}
	if s.ctx != nil {
		select {
		case <-s.ctx.Done():
			return 0, s.ctx.Err()
		case <-s.release:
		}
	} else {
		<-s.release
	}
	return 0, errors.New("source released")
}

func TestCancelledWriteStopsPlugin(t *testing.T) { bothPaths(t, testCancelledWriteStopsPlugin) }

func testCancelledWriteStopsPlugin(t *testing.T, streaming bool) {
	logs := &logBuffer{}
	discover(t, host.Config{Dir: pluginDir(t, "memplugin"), Logger: testLogger(logs), ForceStreaming: streaming})
	st := open(t, "memplug://cancel/w")

	t.Run("source honours ctx: call returns at once", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		src := &blockingSource{head: bytes.NewReader(randomBytes(2<<20, 3)), ctx: ctx, release: make(chan struct{}), reached: make(chan struct{})}
		go func() { <-src.reached; cancel() }()
		start := time.Now()
		err := st.Put(ctx, "obj1", 8<<20, src, backend.PutOptions{})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, time.Since(start), 2*time.Second)
		_, err = st.Stat(context.Background(), "obj1")
		assert.ErrorIs(t, err, backend.ErrNotFound)
	})

	t.Run("source ignores ctx: the plugin aborts before it returns", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		src := &blockingSource{head: bytes.NewReader(randomBytes(2<<20, 4)), release: make(chan struct{}), reached: make(chan struct{})}
		done := make(chan error, 1)
		go func() { done <- st.Put(ctx, "obj2", 8<<20, src, backend.PutOptions{}) }()
		<-src.reached
		cancel()
		// The plugin-side driver sees the cancellation over gRPC while the
		// host is still stuck in the source's Read.
		assert.Eventually(t, func() bool { return logs.Contains(`write aborted; nothing published`) && logs.Contains(`key=w/obj2`) },
			10*time.Second, 10*time.Millisecond, "plugin did not log the aborted write; logs:\n%s", logs)
		select {
		case err := <-done:
			t.Fatalf("Put returned before the source did: %v", err)
		default:
		}
		close(src.release)
		err := <-done
		// The Store reports the source's own failure as the cause.
		require.Error(t, err)
		assert.Contains(t, err.Error(), "context canceled")
		_, err = st.Stat(context.Background(), "obj2")
		assert.ErrorIs(t, err, backend.ErrNotFound)
	})
}

func TestTruncatedWriteStreamIsNotPublished(t *testing.T) {
	bothPaths(t, testTruncatedWriteStreamIsNotPublished)
}

func testTruncatedWriteStreamIsNotPublished(t *testing.T, streaming bool) {
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin"), ForceStreaming: streaming})
	ctx := context.Background()
	raw, err := host.RawClient(ctx, ps[0])
	require.NoError(t, err)
	opened, err := raw.Open(ctx, &pb.OpenRequest{Url: "memplug://raw"})
	require.NoError(t, err)
	st := open(t, "memplug://raw")

	body := randomBytes(3<<20+5, 5)
	sum := crc(body)
	commit := func(n int64, c uint32) *pb.PutFrame {
		return &pb.PutFrame{Frame: &pb.PutFrame_Commit{Commit: &pb.PutCommit{Count: n, Crc32C: c}}}
	}
	// A stream of frames, sent on Put (data inline) or, with the shared
	// segment, on PutShm (data in put slots 0, 1, 2, ...).
	type stream interface {
		Send(*pb.PutFrame) error
		CloseSend() error
	}
	send := func(useShm bool, key string, frames ...*pb.PutFrame) error {
		var s stream
		var finish func() error
		if useShm {
			ps, err := raw.PutShm(ctx)
			require.NoError(t, err)
			s, finish = ps, func() error {
				_ = ps.CloseSend()
				for {
					if _, err := ps.Recv(); err != nil {
						if err == io.EOF {
							return nil
						}
						return err
					}
				}
			}
		} else {
			ps, err := raw.Put(ctx)
			require.NoError(t, err)
			s, finish = ps, func() error { _, err := ps.CloseAndRecv(); return err }
		}
		hdr := &pb.PutFrame{Frame: &pb.PutFrame_Header{Header: &pb.PutHeader{Handle: opened.GetHandle(), Key: key, Size: int64(len(body))}}}
		for _, f := range append([]*pb.PutFrame{hdr}, frames...) {
			if err := s.Send(f); err != nil {
				break // the plugin ended the stream; its status follows
			}
		}
		return finish()
	}
	modes := []bool{false}
	if !streaming {
		modes = append(modes, true)
	}
	for _, useShm := range modes {
		nextSlot := uint32(0)
		// data places b inline, or in the next put slot.
		data := func(b []byte) *pb.PutFrame {
			if !useShm {
				return &pb.PutFrame{Frame: &pb.PutFrame_Data{Data: &pb.PutData{Data: b}}}
			}
			slot, err := host.RawPutSlot(ctx, ps[0], nextSlot%8)
			require.NoError(t, err)
			copy(slot, b)
			ref := &pb.ShmRef{Slot: nextSlot % 8, Length: uint32(len(b))}
			nextSlot++
			return &pb.PutFrame{Frame: &pb.PutFrame_ShmData{ShmData: ref}}
		}
		shmRef := func(slot, n uint32) *pb.PutFrame {
			return &pb.PutFrame{Frame: &pb.PutFrame_ShmData{ShmData: &pb.ShmRef{Slot: slot, Length: n}}}
		}
		cases := []struct {
			name   string
			frames func() []*pb.PutFrame
		}{
			{"all data, no commit", func() []*pb.PutFrame {
				return []*pb.PutFrame{data(body[:1<<20]), data(body[1<<20 : 2<<20]), data(body[2<<20:])}
			}},
			{"half the data", func() []*pb.PutFrame { return []*pb.PutFrame{data(body[:1<<20])} }},
			{"wrong CRC", func() []*pb.PutFrame {
				return []*pb.PutFrame{data(body[:1<<20]), data(body[1<<20 : 2<<20]), data(body[2<<20:]), commit(int64(len(body)), sum+1)}
			}},
			{"wrong count", func() []*pb.PutFrame {
				return []*pb.PutFrame{data(body[:1<<20]), data(body[1<<20 : 2<<20]), data(body[2<<20:]), commit(int64(len(body))+1, sum)}
			}},
			{"early commit", func() []*pb.PutFrame {
				return []*pb.PutFrame{data(body[:1<<20]), data(body[1<<20 : 2<<20]), commit(2<<20, crc(body[:2<<20]))}
			}},
			{"data beyond the size", func() []*pb.PutFrame {
				return []*pb.PutFrame{data(body[:1<<20]), data(body[1<<20 : 2<<20]), data(body[2<<20:]), data([]byte("x")), commit(int64(len(body))+1, sum)}
			}},
			{"oversized frame (5 MiB)", func() []*pb.PutFrame {
				if useShm {
					return []*pb.PutFrame{shmRef(0, 4<<20+1)} // beyond the 4 MiB slot
				}
				return []*pb.PutFrame{data(make([]byte, 5<<20))}
			}},
			{"slot outside the segment", func() []*pb.PutFrame { return []*pb.PutFrame{shmRef(8, 1)} }},
			{"huge slot number", func() []*pb.PutFrame { return []*pb.PutFrame{shmRef(1<<31, 1<<20)} }},
		}
		for _, tc := range cases {
			if !useShm && strings.Contains(tc.name, "slot") {
				// A shared-memory frame on the plain Put stream is refused too.
				tc.name = "plain stream: " + tc.name
			}
			t.Run(fmt.Sprintf("shm=%v/%s", useShm, tc.name), func(t *testing.T) {
				key := fmt.Sprintf("shm%v-%s", useShm, strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "", ":", "").Replace(tc.name))
				assert.Error(t, send(useShm, key, tc.frames()...))
				_, err := st.Stat(ctx, key)
				assert.ErrorIs(t, err, backend.ErrNotFound, "a broken write stream was published")
			})
		}
		t.Run(fmt.Sprintf("shm=%v/complete stream is published", useShm), func(t *testing.T) {
			key := fmt.Sprintf("complete-%v", useShm)
			require.NoError(t, send(useShm, key, data(body[:1<<20]), data(body[1<<20:2<<20]), data(body[2<<20:]), commit(int64(len(body)), sum)))
			got, err := st.ReadAll(ctx, key, 0)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(body, got))
		})
	}
}

func TestPluginKilledMidReadRestarts(t *testing.T) { bothPaths(t, testPluginKilledMidReadRestarts) }

func testPluginKilledMidReadRestarts(t *testing.T, streaming bool) {
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin"), Logger: hclog.NewNullLogger(), ForceStreaming: streaming})
	p := ps[0]
	st := open(t, "memplug://crash/r")
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "big", randomBytes(32<<20, 6), backend.PutOptions{}))

	rc, err := st.NewRangeReader(ctx, "big", 0, -1)
	require.NoError(t, err)
	defer rc.Close()
	_, err = io.ReadFull(rc, make([]byte, 1<<20))
	require.NoError(t, err)
	pid := p.PID()
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	start := time.Now()
	_, err = io.Copy(io.Discard, rc)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.ErrorIs(t, err, host.ErrPluginExited)
	assert.ErrorIs(t, err, backend.ErrTransient, "a read is safe to retry on a restarted plugin")

	// The next call restarts the plugin and re-opens the store on it. The
	// in-memory data died with the process.
	_, err = st.Stat(ctx, "big")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	assert.NotEqual(t, pid, p.PID())
	assert.NotZero(t, p.PID())
	assert.Equal(t, 1, p.Restarts())
	require.NoError(t, st.PutBytes(ctx, "after", []byte("restart"), backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "after", 0)
	require.NoError(t, err)
	assert.Equal(t, "restart", string(got))
}

// seekableBlocking is a rewindable source that blocks once, after head
// bytes, until release is closed; it counts rewinds.
type seekableBlocking struct {
	*bytes.Reader
	head    int64
	reached chan struct{}
	release chan struct{}
	blocked atomic.Bool
	seeks   atomic.Int32
}

func (s *seekableBlocking) Read(p []byte) (int, error) {
	pos := s.Size() - int64(s.Len())
	if pos >= s.head && s.blocked.CompareAndSwap(false, true) {
		close(s.reached)
		<-s.release
	}
	if pos < s.head && int64(len(p)) > s.head-pos {
		p = p[:s.head-pos]
	}
	return s.Reader.Read(p)
}

func (s *seekableBlocking) Seek(off int64, whence int) (int64, error) {
	if !(off == 0 && whence == io.SeekCurrent) {
		s.seeks.Add(1)
	}
	return s.Reader.Seek(off, whence)
}

func TestPluginKilledMidWriteIsNotReplayed(t *testing.T) {
	bothPaths(t, testPluginKilledMidWriteIsNotReplayed)
}

func testPluginKilledMidWriteIsNotReplayed(t *testing.T, streaming bool) {
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin"), Logger: hclog.NewNullLogger(), ForceStreaming: streaming})
	st := open(t, "memplug://crash/w")
	ctx := context.Background()
	src := &seekableBlocking{Reader: bytes.NewReader(randomBytes(4<<20, 7)), head: 2 << 20, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- st.Put(ctx, "obj", int64(src.Size()), src, backend.PutOptions{}) }()
	<-src.reached
	require.NoError(t, syscall.Kill(ps[0].PID(), syscall.SIGKILL))
	// The rest of the source is released only once the host has seen the
	// plugin exit (PID 0 until a later call restarts it).
	require.Eventually(t, func() bool { return ps[0].PID() == 0 }, 10*time.Second, time.Millisecond, "the host never saw the plugin exit")
	close(src.release)
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Put hung after the plugin died")
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, host.ErrPluginExited)
	assert.False(t, backend.IsTransient(err), "a partly sent write must not be classified transient: %v", err)
	assert.Zero(t, src.seeks.Load(), "the write was replayed")
	_, err = st.Stat(ctx, "obj")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestPinMismatchNeverRuns(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(t.TempDir(), "ran")
	script := filepath.Join(dir, "evil")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\ntouch '"+marker+"'\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, host.LockFileName),
		[]byte(strings.Repeat("ab", 32)+"  evil\n"), 0o644))

	_, err := host.Discover(context.Background(), host.Config{Dir: dir})
	require.ErrorIs(t, err, host.ErrChecksumMismatch)
	assert.Contains(t, err.Error(), "evil")
	assert.NoFileExists(t, marker, "a binary with a wrong pin was run")

	// Unpinned binaries are refused when pins are required.
	require.NoError(t, os.Remove(filepath.Join(dir, host.LockFileName)))
	_, err = host.Discover(context.Background(), host.Config{Dir: dir, RequirePins: true})
	require.Error(t, err)
	assert.NoFileExists(t, marker)

	// Control: without a pin the same file does run (and fails the handshake).
	_, err = host.Discover(context.Background(), host.Config{Dir: dir, StartTimeout: 5 * time.Second})
	require.Error(t, err)
	assert.FileExists(t, marker)
}

func TestSymlinkEscapingDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Symlink(memplugin, filepath.Join(dir, "escape")))
	_, err := host.Discover(context.Background(), host.Config{Dir: dir})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outside the plugin directory")
	assert.NotContains(t, backend.Schemes(), "memplug")

	// A symlink that stays inside the directory is fine.
	inside := pluginDir(t, ".real")
	require.NoError(t, os.Symlink(filepath.Join(inside, ".real"), filepath.Join(inside, "memplugin")))
	ps := discover(t, host.Config{Dir: inside})
	require.Len(t, ps, 1)
}

func TestDuplicateSchemeNamesBothPlugins(t *testing.T) {
	dir := pluginDir(t, "first", "second")
	_, err := host.Discover(context.Background(), host.Config{Dir: dir})
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "first"))
	assert.Contains(t, err.Error(), filepath.Join(dir, "second"))
	assert.Contains(t, err.Error(), `"memplug"`)
	assert.NotContains(t, backend.Schemes(), "memplug", "a failed discovery registered a scheme")

	// Across two discoveries as well.
	discover(t, host.Config{Dir: pluginDir(t, "one")})
	_, err = host.Discover(context.Background(), host.Config{Dir: pluginDir(t, "two")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "one")
	assert.Contains(t, err.Error(), "two")
}

func TestClosedPluginFailsCalls(t *testing.T) {
	ps, err := host.Discover(context.Background(), host.Config{Dir: pluginDir(t, "memplugin")})
	require.NoError(t, err)
	st := open(t, "memplug://closed")
	pid := ps[0].PID()
	ps[0].Close()
	assert.False(t, processAlive(pid), "Close left the plugin process running")
	_, err = st.Stat(context.Background(), "x")
	assert.ErrorIs(t, err, host.ErrPluginClosed)
	_, err = backend.Open(context.Background(), "memplug://closed")
	assert.ErrorIs(t, err, backend.ErrUnknownScheme)
}

// processAlive reports whether pid runs (zombies count as gone).
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return len(f) < 3 || f[2] != "Z"
}

const helperEnv = "CKPTKIT_PLUGIN_TEST_HELPER_DIR"

// helperHost is a host process that starts a plugin, prints its pid and
// exits without closing it.
func helperHost() {
	ps, err := host.Discover(context.Background(), host.Config{Dir: os.Getenv(helperEnv)})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(ps[0].PID())
	os.Exit(0)
}

func TestPluginDiesWithHost(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+pluginDir(t, "memplugin"))
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Run())
	line, _ := bufio.NewReader(&out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err, "helper said %q", out.String())
	assert.Eventually(t, func() bool { return !processAlive(pid) }, 5*time.Second, 20*time.Millisecond,
		"plugin %d outlived its host", pid)
}

// TestSharedMemoryConcurrencyAndSlots runs more concurrent writes and reads
// than there are slots, so some take the inline fallback, checks every
// byte, and checks that every put slot is free again afterwards; then a
// cancelled write, after which writes still work.
func TestSharedMemoryConcurrencyAndSlots(t *testing.T) {
	skipWithoutShm(t)
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin")})
	st := open(t, "memplug://conc/run")
	ctx := context.Background()
	const workers = 7
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			errs <- func() error {
				data := randomBytes(9<<20+w, uint64(w))
				key := fmt.Sprintf("obj%d", w)
				if err := st.Put(ctx, key, int64(len(data)), bytes.NewReader(data), backend.PutOptions{}); err != nil {
					return err
				}
				got, err := st.ReadAll(ctx, key, 0)
				if err != nil {
					return err
				}
				if !bytes.Equal(data, got) {
					return fmt.Errorf("%s differs after a round trip", key)
				}
				return nil
			}()
		}()
	}
	for w := 0; w < workers; w++ {
		require.NoError(t, <-errs)
	}
	free, err := host.FreeSlots(ctx, ps[0])
	require.NoError(t, err)
	assert.Equal(t, 8, free, "put slots not returned")

	cctx, cancel := context.WithCancel(ctx)
	src := &blockingSource{head: bytes.NewReader(randomBytes(6<<20, 8)), ctx: cctx, release: make(chan struct{}), reached: make(chan struct{})}
	go func() { <-src.reached; cancel() }()
	assert.ErrorIs(t, st.Put(cctx, "cancelled", 8<<20, src, backend.PutOptions{}), context.Canceled)
	_, err = st.Stat(ctx, "cancelled")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	data := randomBytes(5<<20, 9)
	require.NoError(t, st.Put(ctx, "after", int64(len(data)), bytes.NewReader(data), backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "after", 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

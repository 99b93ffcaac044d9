package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/gcs"
	_ "github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// campaignStall is the stall timeout of the stalled-server classes: short,
// so that a stall costs a second, not the default minute.
const campaignStall = time.Second

// netServer is a server the stalled-server and dropped-commit classes run
// on, through a proxy.
type netServer struct {
	name string
	// env is the URL variable of the server.
	env string
	// large are the URL options that make the campaign's data objects
	// multipart (S3: 5 MiB parts) or resumable (GCS: 1 MiB chunks) uploads.
	large []string
	// commitOf names the object whose upload a request commits (S3: a
	// CompleteMultipartUpload, GCS: the final chunk of a resumable
	// session, both: the single-request write of a checkpoint's metadata),
	// or "" for any other request.
	commitOf func(r *http.Request) string
}

var netServers = []netServer{
	{name: "S3", env: ckpttest.S3URLEnv, large: []string{"part_size", "5MiB", "multipart_threshold", "5MiB"}, commitOf: s3CommitOf},
	{name: "GCS", env: ckpttest.GCSURLEnv, large: []string{"chunk_size", "1MiB"}, commitOf: gcsCommitOf},
}

func s3CommitOf(r *http.Request) string {
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodPost && q.Has("uploadId"):
		return r.URL.Path
	case r.Method == http.MethodPut && !q.Has("uploadId") && strings.HasSuffix(r.URL.Path, "/"+metadata.ObjectKey):
		return r.URL.Path
	}
	return ""
}

// gcsCommitOf knows a final chunk by its Content-Range ("bytes A-B/N" with
// B = N-1): the session URI does not name the object, so the object is
// named by its size (the campaign's two data objects differ in size).
func gcsCommitOf(r *http.Request) string {
	q := r.URL.Query()
	if !strings.HasPrefix(r.URL.Path, "/upload/") {
		return ""
	}
	if q.Has("upload_id") && r.Method != http.MethodDelete {
		rng, total, ok := strings.Cut(strings.TrimPrefix(r.Header.Get("Content-Range"), "bytes "), "/")
		_, last, ok2 := strings.Cut(rng, "-")
		n, err1 := strconv.ParseInt(total, 10, 64)
		b, err2 := strconv.ParseInt(last, 10, 64)
		if ok && ok2 && err1 == nil && err2 == nil && b == n-1 {
			return "resumable object of " + total + " bytes"
		}
		return ""
	}
	if name := q.Get("name"); strings.HasSuffix(name, "/"+metadata.ObjectKey) {
		return name
	}
	return ""
}

// open opens a fresh prefix of the server through a new proxy, with the
// URL options kv, the default retry policy and the campaign's stall
// timeout; it skips when the server is not running. On GCS the driver
// finds the emulator (the proxy) by STORAGE_EMULATOR_HOST, set for the
// rest of the test.
func (srv netServer) open(t *testing.T, kv ...string) (*backend.Store, *faultproxy.Proxy) {
	t.Helper()
	raw := storetest.TestURL(t, srv.env)
	var target string
	if srv.name == "GCS" {
		target = storetest.TestURL(t, "STORAGE_EMULATOR_HOST")
	} else {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		target = u.Query().Get("endpoint")
	}
	p, err := faultproxy.New("http://" + strings.TrimPrefix(target, "http://"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	if srv.name == "GCS" {
		t.Setenv("STORAGE_EMULATOR_HOST", p.Host())
	} else {
		kv = append(kv, "endpoint", p.Host())
	}
	root, err := backend.Open(context.Background(), storetest.WithParams(t, raw, kv...))
	require.NoError(t, err)
	st := storetest.Scratch(t, root)
	t.Cleanup(p.Clear) // runs before the scratch clean-up
	return st.WithStallTimeout(campaignStall), p
}

// campaignRows makes data objects of about 13 MiB per rank (2 ranks):
// three 5 MiB parts on S3, 13 chunks on GCS.
const campaignRows = 1 << 17

// Dropped commits: cycles of save (2 ranks) -> verify --deep -> read back
// on the S3 server and the GCS emulator with the first commit request of
// every object (CompleteMultipartUpload on S3, the final chunk of a
// resumable upload on GCS, the metadata write on both) failed, in turn,
// by a reset and a header block cut before the server acted, a body cut
// after it acted, a stall before it acted and an answer stalled after it
// acted. A cycle survives when the save succeeds, the bytes load back, the
// checkpoint holds exactly its objects and no incomplete upload is left;
// anything else, an error included, is lost: a dropped commit is one
// failure, which the retries must absorb.
func TestDroppedCommits(t *testing.T) {
	for _, srv := range netServers {
		t.Run(srv.name, func(t *testing.T) { droppedCommitCycles(t, srv) })
	}
}

func droppedCommitCycles(t *testing.T, srv netServer) {
	n := size(20, 2)
	ctx := context.Background()
	run, p := srv.open(t, srv.large...)
	var mu sync.Mutex
	dropped := map[string]bool{}
	cycle := 0
	drop := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool {
		obj := srv.commitOf(r)
		if obj == "" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		k := fmt.Sprint(cycle, obj)
		first := !dropped[k]
		dropped[k] = true
		return first
	}, Breaks: []faultproxy.Break{faultproxy.Reset, faultproxy.CutBody, faultproxy.Stall, faultproxy.BrokenHeaders, faultproxy.StallResponse}})
	ok, lost := 0, 0
	var firstLoss string
	start := time.Now()
	for i := range n {
		mu.Lock()
		cycle = i
		mu.Unlock()
		s := ckpttest.NewState(uint64(200+i), campaignRows)
		st, err := run.Sub(catalog.StepName(int64(i)))
		require.NoError(t, err)
		err = committedExactly(ctx, st, s)
		if err == nil {
			ok++
			continue
		}
		lost++
		t.Logf("cycle %d lost: %v", i, err)
		if firstLoss == "" {
			firstLoss = err.Error()
		}
	}
	p.Clear()
	record(row{Class: "dropped commits, " + srv.name, Tried: n, Survived: ok, Lost: lost,
		Note: fmt.Sprintf("%d commit requests dropped (reset, body cut after the server acted, stall, headers cut, answer stalled after it acted, in turn) in %d cycles of a 2-rank save of 2 x 13 MiB objects, %s", p.Failed(drop), n, time.Since(start).Round(time.Second))})
	require.Positive(t, p.Failed(drop), "no commit request was dropped: nothing was checked")
	require.Zero(t, lost, firstLoss)
}

// committedExactly saves s at st, checks it loads back with its bytes and
// that st holds exactly the checkpoint's objects and no incomplete upload.
func committedExactly(ctx context.Context, st *backend.Store, s *ckpttest.State) error {
	if err := cycle(ctx, st, s); err != nil {
		return err
	}
	c, err := loader.Open(ctx, st)
	if err != nil {
		return err
	}
	want := []string{c.MetadataKey()}
	for _, o := range c.Metadata().Objects {
		want = append(want, o.Key)
	}
	sort.Strings(want)
	var got []string
	if err := st.List(ctx, "", func(o backend.ObjectInfo) error { got = append(got, o.Key); return nil }); err != nil {
		return err
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("objects stored %v, the checkpoint's %v", got, want)
	}
	var left []string
	if err := st.ListUploads(ctx, "", func(u backend.Upload) error { left = append(left, u.Key); return nil }); err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("incomplete uploads left: %v", left)
	}
	return nil
}

// Stalled server: save -> verify --deep -> load cycles on the S3 server and
// the GCS emulator through a proxy that stalls one request in 30 (accepts
// it and answers nothing, before the server saw it or after it acted, in
// turn), with a 1 s stall timeout. A cycle survives when it ends with the
// saved bytes; it ends with a clear error when the retries run out on
// stalls (transient, exit code 5); it is lost when it ends with wrong
// data, an unclassified error or a cancellation (the stalled
// server read as Ctrl-C), or hangs.
func TestStalledServer(t *testing.T) {
	for _, srv := range netServers {
		t.Run(srv.name, func(t *testing.T) { stalledCycles(t, srv) })
	}
}

func stalledCycles(t *testing.T, srv netServer) {
	n := size(50, 3)
	ctx := context.Background()
	run, p := srv.open(t)
	stall := p.Add(&faultproxy.Rule{Match: func(*http.Request) bool { return rand.IntN(30) == 0 },
		Breaks: []faultproxy.Break{faultproxy.Stall, faultproxy.StallResponse}})
	seen := p.Add(&faultproxy.Rule{Match: func(*http.Request) bool { return true }, Fail: func(int) bool { return false }})
	ok, clear, lost := 0, 0, 0
	var firstLoss string
	var slowest time.Duration
	for i := range n {
		s := ckpttest.NewState(uint64(300+i), 8)
		st, err := run.Sub(catalog.StepName(int64(i)))
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		t0 := time.Now()
		err = cycle(cctx, st, s)
		hung := cctx.Err() != nil
		cancel()
		slowest = max(slowest, time.Since(t0))
		class := ckpterr.ClassOf(err)
		switch {
		case err == nil:
			ok++
		case !hung && class == ckpterr.Transient && !errors.Is(err, errWrongData):
			clear++
			t.Logf("cycle %d: clear error: %v", i, err)
		default:
			lost++
			t.Logf("cycle %d lost (%s, hung %v): %v", i, class, hung, err)
			if firstLoss == "" {
				firstLoss = fmt.Sprintf("%s: %v", class, err)
			}
		}
	}
	p.Clear()
	record(row{Class: "stalled server (requests accepted, never answered), " + srv.name, Tried: n, Survived: ok, Lost: lost,
		Note: fmt.Sprintf("%d of %d requests stalled, stall timeout %s; %d cycles ended with a clear transient error; slowest cycle %s", p.Failed(stall), p.Count(seen), campaignStall, clear, slowest.Round(time.Millisecond))})
	require.Positive(t, p.Failed(stall), "no request was stalled: nothing was checked")
	require.Zero(t, lost, firstLoss)
}

// Stopped server under ckpt train: the attack. A `ckpt train`
// saving every step runs against the S3 server or the GCS emulator through
// a proxy that, from a uniformly random request of the run on, accepts
// every request and answers nothing (a SIGSTOPped server), with
// CKPTKIT_STALL_TIMEOUT=1s. It survives when it exits 5 (transient)
// saying it got no progress, and every checkpoint it committed before
// verifies --deep; it is lost when it exits otherwise (130 as if
// interrupted, 10), hangs (2 minutes), or a committed checkpoint is bad.
func TestStoppedServerUnderTrain(t *testing.T) {
	for _, srv := range netServers {
		t.Run(srv.name, func(t *testing.T) { stoppedServerRuns(t, srv) })
	}
}

func stoppedServerRuns(t *testing.T, srv netServer) {
	n := size(10, 1)
	t.Setenv(backend.StallTimeoutEnv, campaignStall.String())
	// The reference run counts the requests of a whole run.
	ref, p := srv.open(t)
	all := p.Add(&faultproxy.Rule{Match: func(*http.Request) bool { return true }, Fail: func(int) bool { return false }})
	args := func(st *backend.Store) []string {
		return []string{"train", "--url", st.String(), "--steps", "6", "--save-every", "1", "--ranks", "2", "--seed", "5"}
	}
	r := run(t, 2*time.Minute, args(ref)...)
	require.Equal(t, 0, r.code, r.errs)
	total := p.Count(all)
	p.Clear()
	ok, lost := 0, 0
	var firstLoss string
	var times []time.Duration
	for i := range n {
		st, err := ref.Sub(fmt.Sprint("stopped-", i))
		require.NoError(t, err)
		stopAt := 1 + rand.IntN(total)
		var seenN atomic.Int64
		p.Add(&faultproxy.Rule{Match: func(*http.Request) bool { return seenN.Add(1) >= int64(stopAt) }, Break: faultproxy.Stall})
		r := run(t, 2*time.Minute, args(st)...)
		p.Clear()
		bad := committedBad(t, st)
		survived := !r.timedOut && bad == "" && (r.code == 0 || r.code == 5 && strings.Contains(r.errs, "no progress for "+campaignStall.String()))
		if r.code == 5 {
			times = append(times, r.elapsed)
		}
		if survived {
			ok++
			continue
		}
		lost++
		loss := fmt.Sprintf("stopped at request %d of %d: exit %d after %s (timed out %v), bad checkpoint %q: %s", stopAt, total, r.code, r.elapsed.Round(time.Millisecond), r.timedOut, bad, r.errs)
		t.Log(loss)
		if firstLoss == "" {
			firstLoss = loss
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	note := fmt.Sprintf("ckpt train --steps 6 --save-every 1 --ranks 2 (%d requests), server stopped at a uniform request; survived = exit 5 naming the stall (or 0 when the stop came after the last request), every checkpoint committed before verifies", total)
	if len(times) > 0 {
		note += fmt.Sprintf("; exit 5 after %s to %s", times[0].Round(100*time.Millisecond), times[len(times)-1].Round(100*time.Millisecond))
	}
	record(row{Class: "stopped server under ckpt train, " + srv.name, Tried: n, Survived: ok, Lost: lost, Note: note})
	require.Zero(t, lost, firstLoss)
}

// committedBad returns why a checkpoint committed under the run st is not
// resumable, or "".
func committedBad(t *testing.T, st *backend.Store) string {
	t.Helper()
	ctx := context.Background()
	entries, err := catalog.List(ctx, st)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Committed {
			continue
		}
		sub, err := st.Sub(e.Name)
		require.NoError(t, err)
		c, err := loader.Open(ctx, sub)
		var rep *loader.VerifyReport
		if err == nil {
			rep, err = c.Verify(ctx, loader.VerifyOptions{Deep: true})
		}
		if err != nil {
			return fmt.Sprintf("%s: %v", e.URL, err)
		}
		if !rep.Resumable {
			return fmt.Sprintf("%s: %v", e.URL, rep.Problems)
		}
	}
	return ""
}

package run_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// durables are the durable tiers a tiered test runs on: S3 when the test
// server runs (the tier it is for), else fs.
func durables(t *testing.T) []ckpttest.Backend {
	var out []ckpttest.Backend
	for _, b := range ckpttest.Backends(t) {
		if b.Name != "mem" {
			out = append(out, b)
		}
	}
	return out
}

// cutData truncates rank's data object of the checkpoint at st to half.
func cutData(t *testing.T, st *backend.Store, rank int) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	for _, o := range c.Metadata().Objects {
		if strings.HasPrefix(o.Key, fmt.Sprintf("rank-%05d-", rank)) {
			data, err := st.ReadAll(ctx, o.Key, 0)
			require.NoError(t, err)
			require.NoError(t, st.PutBytes(ctx, o.Key, data[:len(data)/2], backend.PutOptions{}))
			return
		}
	}
	t.Fatalf("no data object of rank %d in %s", rank, st)
}

// committedSteps lists the committed steps of the run at st.
func committedSteps(t *testing.T, st *backend.Store) []int64 {
	t.Helper()
	es, err := catalog.List(context.Background(), st)
	require.NoError(t, err)
	out := []int64{}
	for _, e := range es {
		if e.Committed {
			out = append(out, e.Step)
		}
	}
	return out
}

// A tiered run commits every save locally and persists every 4th step to
// the durable run; local retention keeps 2 steps. Resume takes the local
// tier; with a local data object cut, or the local tier gone, it takes the
// newest durable step, and says why.
func TestTieredPersistsAndResumesFromTheNearestTier(t *testing.T) {
	const world = 2
	ctx := context.Background()
	for _, b := range durables(t) {
		t.Run(b.Name, func(t *testing.T) {
			durable := b.Open(t)
			localDir := t.TempDir()
			local := ckpttest.OpenURL(t, "file://"+localDir)
			tr := run.NewTiered(run.New(local), run.New(durable), run.TierOptions{PersistEvery: 4})
			states := map[int64]*ckpttest.State{}
			for _, step := range []int64{2, 4, 6, 8} {
				states[step] = ckpttest.NewState(uint64(step), 6)
				_, ended, err := tr.SaveLocal(ctx, step, states[step].Shard(world), saver.Options{})
				require.NoError(t, err)
				for _, p := range ended {
					require.NoError(t, p.Err)
				}
				if step == 4 {
					// Step 4's persist ends before step 8 commits: in flight
					// then, retention would rightly keep it (seen on a loaded
					// machine: local held 4, 6, 8).
					ended, err := tr.Wait(ctx, time.Minute)
					require.NoError(t, err)
					for _, p := range ended {
						require.NoError(t, p.Err)
					}
				}
			}
			ended, err := tr.Wait(ctx, time.Minute)
			require.NoError(t, err)
			for _, p := range ended {
				require.NoError(t, p.Err)
			}
			require.NoError(t, tr.Close(time.Minute))
			st := tr.Stats()
			var persisted []int64
			for _, p := range st.Persists {
				persisted = append(persisted, p.Step)
			}
			assert.Equal(t, []int64{4, 8}, persisted)
			assert.Equal(t, []int64{4, 8}, committedSteps(t, durable))
			assert.Equal(t, []int64{6, 8}, committedSteps(t, local), "local keeps 2")

			resume := func() (*run.TierResumed, []*statedict.StateDict) {
				var got []*statedict.StateDict
				var calls atomic.Int32
				tr := run.NewTiered(run.New(local), run.New(durable), run.TierOptions{})
				defer tr.Close(0)
				res, err := tr.ResumeTiered(ctx, run.ResumeOptions{Load: loadInto(states[8], 0, 1, &got, &calls)})
				require.NoError(t, err)
				return res, got
			}
			res, got := resume()
			assert.Equal(t, run.TierLocal, res.Tier, res.Why)
			assert.Equal(t, int64(8), res.Entry.Step)
			requireShard(t, states[8], 0, 1, got)

			// A local data object cut: local step 8 is damaged, local step
			// 6 is older than the durable step 8, which is taken.
			s8, err := run.New(local).Step(8)
			require.NoError(t, err)
			cutData(t, s8, 1)
			res, got = resume()
			assert.Equal(t, run.TierDurable, res.Tier, res.Why)
			assert.Equal(t, int64(8), res.Entry.Step)
			assert.Equal(t, []string{"step-00000008:damaged"}, whys(res.Skipped))
			requireShard(t, states[8], 0, 1, got)

			// The local tier gone: the durable step 8.
			require.NoError(t, os.RemoveAll(localDir))
			res, got = resume()
			assert.Equal(t, run.TierDurable, res.Tier, res.Why)
			assert.Equal(t, int64(8), res.Entry.Step)
			requireShard(t, states[8], 0, 1, got)
		})
	}
}

// A persist that fails (a file where the durable step's prefix goes) is reported on
// the next save and by Close, never dropped; the local commits go on.
func TestTieredReportsAFailedPersist(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	durableDir := filepath.Join(dir, "durable")
	require.NoError(t, os.MkdirAll(durableDir, 0o755))
	for step := range int64(4) {
		// A file where the step's prefix would be: its persist fails.
		require.NoError(t, os.WriteFile(filepath.Join(durableDir, catalog.StepName(step)), []byte("not a directory"), 0o644))
	}
	durable := ckpttest.OpenURL(t, "file://"+durableDir)
	local := ckpttest.OpenURL(t, "file://"+filepath.Join(dir, "local"))
	tr := run.NewTiered(run.New(local), run.New(durable), run.TierOptions{})
	s := ckpttest.NewState(1, 4)
	_, _, err := tr.SaveLocal(ctx, 1, s.Shard(1), saver.Options{})
	require.NoError(t, err)
	_, err = tr.Wait(ctx, time.Minute)
	require.NoError(t, err)
	// Wait took the ended persists; a second failing one is reported by
	// the next save.
	_, _, err = tr.SaveLocal(ctx, 2, s.Shard(1), saver.Options{})
	require.NoError(t, err)
	var ended []run.Persist
	require.Eventually(t, func() bool {
		var err error
		_, ended, err = tr.SaveLocal(ctx, 3, s.Shard(1), saver.Options{})
		return err == nil && len(ended) > 0
	}, time.Minute, 10*time.Millisecond)
	require.Error(t, ended[0].Err)
	assert.Contains(t, ended[0].Err.Error(), "persist step 2")
	err = tr.Close(time.Minute)
	require.Error(t, err, "the last persist's failure")
	assert.Contains(t, err.Error(), "persist step")
	for _, p := range tr.Stats().Persists {
		assert.Error(t, p.Err)
	}
	assert.Equal(t, []int64{2, 3}, committedSteps(t, local)[len(committedSteps(t, local))-2:])
}

// Four goroutine ranks, each with its own local directory (its node),
// agree through the store coordinator: all intact, they resume from the
// local tier; one node's local directory wiped, every rank resumes from the
// durable tier, the same step.
func TestTieredRanksAgreeOnTheTier(t *testing.T) {
	const world = 4
	ctx := context.Background()
	for _, b := range durables(t) {
		t.Run(b.Name, func(t *testing.T) {
			durable := b.Open(t)
			states := saveSteps(t, durable, world, 4)
			dirs := make([]string, world)
			for rank := range world {
				dirs[rank] = t.TempDir()
				l := ckpttest.OpenURL(t, "file://"+dirs[rank])
				for _, s := range []int64{4, 6} {
					if states[s] == nil {
						states[s] = ckpttest.NewState(uint64(s), 6)
					}
					_, err := run.New(l).SaveLocal(ctx, s, states[s].Shard(world), saver.Options{})
					require.NoError(t, err)
				}
			}
			resume := func(wantStep int64) []*run.TierResumed {
				group := fmt.Sprintf("tier-%d", time.Now().UnixNano())
				res, errs := make([]*run.TierResumed, world), make([]error, world)
				got := make([][]*statedict.StateDict, world)
				var wg sync.WaitGroup
				for rank := range world {
					wg.Go(func() {
						l := ckpttest.OpenURL(t, "file://"+dirs[rank])
						d := run.New(durable)
						c, err := d.NewCoordinator(group, rank, world, fast)
						if err != nil {
							errs[rank] = err
							return
						}
						defer c.Close(ctx)
						tr := run.NewTiered(run.New(l), d, run.TierOptions{})
						defer tr.Close(0)
						var calls atomic.Int32
						res[rank], errs[rank] = tr.ResumeTiered(ctx, run.ResumeOptions{Coordinator: c, Load: loadInto(states[wantStep], rank, world, &got[rank], &calls)})
					})
				}
				wg.Wait()
				for rank := range world {
					require.NoError(t, errs[rank], "rank %d", rank)
					assert.Equal(t, wantStep, res[rank].Entry.Step, "rank %d", rank)
					requireShard(t, states[wantStep], rank, world, got[rank])
				}
				return res
			}
			for rank, r := range resume(6) {
				assert.Equal(t, run.TierLocal, r.Tier, "rank %d", rank)
			}
			require.NoError(t, os.RemoveAll(dirs[2]))
			for rank, r := range resume(4) {
				assert.Equal(t, run.TierDurable, r.Tier, "rank %d: %s", rank, r.Why)
			}
		})
	}
}

// With the durable S3 run slow (the proxy holds back the answers to step
// 1's uploads) and its first upload failing once: step 1's persist is in
// flight (copied again), step 2 is queued, step 3
// supersedes step 2, never step 1; Wait is bounded by its grace; Close
// waits for both persists.
func TestTieredPersistsOneAtATime(t *testing.T) {
	ctx := context.Background()
	durable, proxy := ckpttest.ProxiedS3(t, backend.RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	step1 := func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.Contains(r.URL.Path, catalog.StepName(1)+"/")
	}
	failOnce := proxy.Add(&faultproxy.Rule{Match: step1, Fail: func(n int) bool { return n == 0 }, Status: http.StatusServiceUnavailable, Body: "<Error><Code>SlowDown</Code></Error>"})
	proxy.Add(&faultproxy.Rule{Match: step1, Fail: func(int) bool { return false }, Delay: 300 * time.Millisecond})
	local := ckpttest.OpenURL(t, "file://"+t.TempDir())
	tr := run.NewTiered(run.New(local), run.New(durable), run.TierOptions{LocalKeep: 5, Retry: backend.RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	s := ckpttest.NewState(1, 4)
	for step := int64(1); step <= 3; step++ {
		_, ended, err := tr.SaveLocal(ctx, step, s.Shard(1), saver.Options{})
		require.NoError(t, err)
		require.Empty(t, ended, "step 1's persist is still in flight")
	}
	_, err := tr.Wait(ctx, 10*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "persist of step 1")
	require.NoError(t, tr.Close(time.Minute))
	st := tr.Stats()
	require.Len(t, st.Persists, 2)
	for _, p := range st.Persists {
		require.NoError(t, p.Err)
	}
	assert.Equal(t, int64(1), st.Persists[0].Step)
	assert.Equal(t, int64(3), st.Persists[1].Step, "step 3 superseded the queued step 2")
	assert.Equal(t, 1, st.Superseded)
	assert.Equal(t, 1, proxy.Failed(failOnce))
	assert.Equal(t, 1, st.Persists[0].Retries, "the failed copy was started again")
	assert.Equal(t, []int64{1, 3}, committedSteps(t, durable))
}

// Local copies rescue a run whose durable checkpoints are all invalid; a
// damaged local copy with nothing committed in the durable run is refused,
// never a silent fresh start.
func TestTieredLocalRescuesAndNeverRestartsSilently(t *testing.T) {
	ctx := context.Background()
	durable := ckpttest.OpenURL(t, "file://"+t.TempDir())
	local := ckpttest.OpenURL(t, "file://"+t.TempDir())
	states := saveSteps(t, durable, 1, 4)
	require.NoError(t, durable.PutBytes(ctx, catalog.StepName(4)+"/ckptkit.metadata.json", []byte("{not json"), backend.PutOptions{}))
	_, err := run.New(local).SaveLocal(ctx, 2, ckpttest.NewState(2, 6).Shard(1), saver.Options{})
	require.NoError(t, err)
	states[2] = ckpttest.NewState(2, 6)
	tr := run.NewTiered(run.New(local), run.New(durable), run.TierOptions{})
	defer tr.Close(0)
	var got []*statedict.StateDict
	var calls atomic.Int32
	res, err := tr.ResumeTiered(ctx, run.ResumeOptions{Load: loadInto(states[2], 0, 1, &got, &calls)})
	require.NoError(t, err)
	assert.Equal(t, run.TierLocal, res.Tier, res.Why)
	assert.Equal(t, int64(2), res.Entry.Step)
	requireShard(t, states[2], 0, 1, got)

	empty := ckpttest.OpenURL(t, "file://"+t.TempDir())
	s2, err := run.New(local).Step(2)
	require.NoError(t, err)
	cutData(t, s2, 0)
	tr2 := run.NewTiered(run.New(local), run.New(empty), run.TierOptions{})
	defer tr2.Close(0)
	_, err = tr2.ResumeTiered(ctx, run.ResumeOptions{AllowFresh: true, Load: loadInto(states[2], 0, 1, &got, &calls)})
	require.ErrorIs(t, err, run.ErrNoValidCheckpoint)
}

// Replicated state: each of two ranks commits the whole state to its own
// local tier, only rank 0 persists (rank 1 NoPersist); the durable run holds
// rank 0's copies alone, which every rank resumes from once rank 1's local
// tier is gone.
func TestTieredNoPersistRankOnlyCommitsLocally(t *testing.T) {
	ctx := context.Background()
	durable := ckpttest.OpenURL(t, "file://"+t.TempDir())
	dirs := []string{t.TempDir(), t.TempDir()}
	s := ckpttest.NewState(3, 4)
	for rank, dir := range dirs {
		tr := run.NewTiered(run.New(ckpttest.OpenURL(t, "file://"+dir)), run.New(durable),
			run.TierOptions{NoPersist: rank == 1})
		for _, step := range []int64{1, 2} {
			_, ended, err := tr.SaveLocal(ctx, step, s.Shard(1), saver.Options{})
			require.NoError(t, err)
			for _, p := range ended {
				require.NoError(t, p.Err)
			}
		}
		require.NoError(t, tr.Close(time.Minute))
		assert.Equal(t, []int64{1, 2}, committedSteps(t, ckpttest.OpenURL(t, "file://"+dir)), "rank %d", rank)
		if rank == 1 {
			assert.Empty(t, tr.Stats().Persists, "rank 1 never persists")
		} else {
			assert.Len(t, tr.Stats().Persists, 2)
		}
	}
	assert.Equal(t, []int64{1, 2}, committedSteps(t, durable))

	require.NoError(t, os.RemoveAll(dirs[1]))
	var got []*statedict.StateDict
	var calls atomic.Int32
	tr := run.NewTiered(run.New(ckpttest.OpenURL(t, "file://"+dirs[1])), run.New(durable), run.TierOptions{NoPersist: true})
	defer tr.Close(0)
	res, err := tr.ResumeTiered(ctx, run.ResumeOptions{Load: loadInto(s, 0, 1, &got, &calls)})
	require.NoError(t, err)
	assert.Equal(t, run.TierDurable, res.Tier, res.Why)
	assert.Equal(t, int64(2), res.Entry.Step)
	requireShard(t, s, 0, 1, got)
}

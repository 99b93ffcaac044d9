package run_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// flipDataByte flips a byte in the middle of rank's data object of the
// checkpoint at st: its metadata still verifies, only reading finds it.
func flipDataByte(t *testing.T, st *backend.Store, rank int) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	for _, o := range c.Metadata().Objects {
		if !strings.HasPrefix(o.Key, fmt.Sprintf("rank-%05d-", rank)) {
			continue
		}
		data, err := st.ReadAll(ctx, o.Key, 0)
		require.NoError(t, err)
		data[len(data)/2] ^= 0x40
		require.NoError(t, st.PutBytes(ctx, o.Key, data, backend.PutOptions{}))
		return
	}
	t.Fatalf("no data object of rank %d in %s", rank, st)
}

// saveSteps saves the state of seed = step under r for each step, sharded
// over world ranks, and returns the states.
func saveSteps(t *testing.T, st *backend.Store, world int, steps ...int64) map[int64]*ckpttest.State {
	t.Helper()
	out := map[int64]*ckpttest.State{}
	for _, s := range steps {
		out[s] = ckpttest.NewState(uint64(s), 6)
		_, err := run.New(st).SaveLocal(context.Background(), s, out[s].Shard(world), saver.Options{})
		require.NoError(t, err)
	}
	return out
}

// loadInto returns a LoadFunc loading rank's shard (of world) into fresh
// targets each call, the last of which *got receives, and counting calls.
func loadInto(s *ckpttest.State, rank, world int, got *[]*statedict.StateDict, calls *atomic.Int32) run.LoadFunc {
	return run.Into(func() []*statedict.StateDict {
		calls.Add(1)
		*got = ckpttest.Targets(s.Shard(world)[rank : rank+1])
		return *got
	}, loader.Options{})
}

// requireShard checks that got holds rank's shard of s.
func requireShard(t *testing.T, s *ckpttest.State, rank, world int, got []*statedict.StateDict) {
	t.Helper()
	want := s.Shard(world)[rank]
	for k, sh := range want.Tensors {
		require.Equal(t, sh.Data, got[0].Tensors[k].Data, "rank %d: %s", rank, k)
	}
	for k, b := range want.Bytes {
		require.Equal(t, b, got[0].Bytes[k], "rank %d: %s", rank, k)
	}
}

func whys(ss []run.Skipped) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, fmt.Sprintf("%s:%s", s.Entry.Name, s.Why))
	}
	return out
}

// A run under which nothing is stored is not resumed from: without
// AllowFresh it is ErrNothingStored (a mistyped URL), with it a fresh
// start; a run holding only an abandoned save starts fresh and says what it
// passed over. Load is never called.
func TestResumeFresh(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			var calls atomic.Int32
			var got []*statedict.StateDict
			load := loadInto(ckpttest.NewState(1, 6), 0, 1, &got, &calls)

			_, err := r.Resume(ctx, run.ResumeOptions{Load: load})
			require.ErrorIs(t, err, run.ErrNothingStored)
			assert.Equal(t, ckpterr.NotFound, ckpterr.ClassOf(err))

			res, err := r.Resume(ctx, run.ResumeOptions{Load: load, AllowFresh: true})
			require.NoError(t, err)
			assert.True(t, res.Fresh)
			assert.True(t, res.Empty)
			assert.Nil(t, res.Checkpoint)

			saveSteps(t, st, 1, 5)
			step5, err := r.Step(5)
			require.NoError(t, err)
			require.NoError(t, step5.Delete(ctx, metadata.ObjectKey)) // an abandoned save
			res, err = r.Resume(ctx, run.ResumeOptions{Load: load})
			require.NoError(t, err)
			assert.True(t, res.Fresh)
			assert.False(t, res.Empty)
			assert.Equal(t, []string{"step-00000005:uncommitted"}, whys(res.Skipped))
			assert.Zero(t, calls.Load(), "nothing was loaded")
		})
	}
}

// Committed checkpoints of which none is valid are refused, never a fresh
// start: the error is a *RefusedError of class bad-checkpoint naming the
// newest one and its problem.
func TestResumeRefuses(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			saveSteps(t, st, 1, 10, 20)
			for _, s := range []int64{10, 20} {
				cs, err := r.Step(s)
				require.NoError(t, err)
				require.NoError(t, cs.PutBytes(ctx, metadata.ObjectKey, []byte("{not json"), backend.PutOptions{}))
			}
			var calls atomic.Int32
			var got []*statedict.StateDict
			_, err := r.Resume(ctx, run.ResumeOptions{Load: loadInto(ckpttest.NewState(1, 6), 0, 1, &got, &calls), AllowFresh: true})
			require.ErrorIs(t, err, run.ErrNoValidCheckpoint)
			assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
			var re *run.RefusedError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, 2, re.Committed)
			assert.Equal(t, "step-00000020", re.Newest.Entry.Name)
			assert.Equal(t, run.Invalid, re.Newest.Why)
			assert.ErrorIs(t, err, metadata.ErrInvalid, "the newest one's problem is in the chain")
			assert.Contains(t, err.Error(), "every committed checkpoint failed verification")
			assert.Zero(t, calls.Load())

			// Latest, which `ckpt latest` runs, refuses alike.
			_, skipped, err := r.Latest(ctx, run.LatestOptions{})
			require.ErrorIs(t, err, run.ErrNoValidCheckpoint)
			assert.Equal(t, []string{"step-00000020:invalid", "step-00000010:invalid"}, whys(skipped))
		})
	}
}

// Past an uncommitted step and a damaged one, Resume loads the next older
// valid checkpoint and says what it skipped and why.
func TestResumeFallsBackAndSaysWhy(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			states := saveSteps(t, st, 1, 10, 20, 30)
			s20, err := r.Step(20)
			require.NoError(t, err)
			flipDataByte(t, s20, 0)
			s30, err := r.Step(30)
			require.NoError(t, err)
			require.NoError(t, s30.Delete(ctx, metadata.ObjectKey))

			var calls atomic.Int32
			var got []*statedict.StateDict
			var logged []string
			res, err := r.Resume(ctx, run.ResumeOptions{Load: loadInto(states[10], 0, 1, &got, &calls),
				Logf: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }})
			require.NoError(t, err)
			assert.False(t, res.Fresh)
			assert.Equal(t, int64(10), res.Entry.Step)
			assert.Equal(t, int64(10), res.Report.Iteration)
			assert.Equal(t, r.StepURL(10), res.Checkpoint.URL())
			assert.Equal(t, []string{"step-00000030:uncommitted", "step-00000020:damaged"}, whys(res.Skipped))
			require.ErrorIs(t, res.Skipped[1].Err, loader.ErrChecksum)
			assert.Equal(t, int32(2), calls.Load(), "one attempt at step 20, one at step 10")
			requireShard(t, states[10], 0, 1, got)
			assert.Contains(t, strings.Join(logged, "\n"), "falling back to the next older valid checkpoint")
		})
	}
}

// fast polls the store coordinator quickly.
var fast = coordinator.StoreOptions{PollInterval: time.Millisecond, MaxPollInterval: 20 * time.Millisecond, Timeout: 2 * time.Minute}

// ranks runs Resume on world ranks, goroutines that share nothing but the
// run's store and coordinate through it.
func ranks(t *testing.T, st *backend.Store, world int, opts func(rank int) run.ResumeOptions) ([]*run.Resumed, []error) {
	t.Helper()
	ctx := context.Background()
	group := fmt.Sprintf("resume-%d", time.Now().UnixNano())
	res, errs := make([]*run.Resumed, world), make([]error, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			r := run.New(st)
			c, err := r.NewCoordinator(group, rank, world, fast)
			if err != nil {
				errs[rank] = err
				return
			}
			o := opts(rank)
			o.Coordinator = c
			res[rank], errs[rank] = r.Resume(ctx, o)
			if cerr := c.Close(ctx); cerr != nil && errs[rank] == nil {
				errs[rank] = cerr
			}
		})
	}
	wg.Wait()
	return res, errs
}

// Three ranks agree on one step through the store coordinator: rank 2's
// data of step 20 is damaged, so it falls back to step 10, and the other
// ranks, which loaded step 20, load step 10 too and say why.
func TestResumeRanksAgreeThroughTheStore(t *testing.T) {
	const world = 3
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			st := b.Open(t)
			r := run.New(st)
			states := saveSteps(t, st, world, 10, 20)
			s20, err := r.Step(20)
			require.NoError(t, err)
			flipDataByte(t, s20, 2)

			got := make([][]*statedict.StateDict, world)
			calls := make([]atomic.Int32, world)
			res, errs := ranks(t, st, world, func(rank int) run.ResumeOptions {
				return run.ResumeOptions{Load: loadInto(states[10], rank, world, &got[rank], &calls[rank])}
			})
			for rank := range world {
				require.NoError(t, errs[rank], "rank %d", rank)
				assert.Equal(t, int64(10), res[rank].Entry.Step, "rank %d", rank)
				assert.Equal(t, int64(10), res[rank].Report.Iteration, "rank %d", rank)
				requireShard(t, states[10], rank, world, got[rank])
				assert.Equal(t, int32(2), calls[rank].Load(), "rank %d: step 20, then step 10", rank)
			}
			assert.Equal(t, []string{"step-00000020:other-rank"}, whys(res[0].Skipped))
			assert.Equal(t, []string{"step-00000020:other-rank"}, whys(res[1].Skipped))
			assert.Equal(t, []string{"step-00000020:damaged"}, whys(res[2].Skipped))

			// The coordinator's rounds are gone; the run lists its steps only.
			n := 0
			require.NoError(t, st.List(context.Background(), run.CoordPrefix+"/", func(backend.ObjectInfo) error { n++; return nil }))
			assert.Zero(t, n, "rank 0 removed the group")
		})
	}
}

// Rank 0's refusal reaches every rank, classified, and a fresh start is
// every rank's.
func TestResumeRanksShareRefusalAndFreshStart(t *testing.T) {
	const world = 2
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			var calls atomic.Int32
			opts := func(rank int) run.ResumeOptions {
				var got []*statedict.StateDict
				return run.ResumeOptions{Load: loadInto(ckpttest.NewState(1, 6), rank, world, &got, &calls), AllowFresh: true}
			}
			res, errs := ranks(t, st, world, opts)
			for rank := range world {
				require.NoError(t, errs[rank], "rank %d", rank)
				assert.True(t, res[rank].Fresh && res[rank].Empty, "rank %d", rank)
			}

			saveSteps(t, st, world, 10)
			cs, err := run.New(st).Step(10)
			require.NoError(t, err)
			require.NoError(t, cs.PutBytes(ctx, metadata.ObjectKey, []byte("{not json"), backend.PutOptions{}))
			_, errs = ranks(t, st, world, opts)
			for rank := range world {
				require.ErrorIs(t, errs[rank], run.ErrNoValidCheckpoint, "rank %d", rank)
				assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(errs[rank]), "rank %d", rank)
			}
			assert.Zero(t, calls.Load())
		})
	}
}

// Choose is the one rule: a checkpoint URL opens the checkpoint; a run URL
// its newest valid step; data without metadata or steps is an incomplete
// checkpoint; a step-named URL under which nothing is stored is a typo.
func TestChoose(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			saveSteps(t, st, 1, 10, 20)

			ch, err := run.Choose(ctx, st, run.LatestOptions{})
			require.NoError(t, err)
			require.NotNil(t, ch.Run)
			assert.Equal(t, "step-00000020", ch.Entry.Name)
			assert.Equal(t, r.StepURL(20), ch.Checkpoint.URL())

			s10, err := r.Step(10)
			require.NoError(t, err)
			ch, err = run.Choose(ctx, s10, run.LatestOptions{})
			require.NoError(t, err)
			assert.Nil(t, ch.Run)
			assert.Equal(t, int64(10), ch.Checkpoint.Metadata().Training.Iteration)

			require.NoError(t, s10.Delete(ctx, metadata.ObjectKey))
			_, err = run.Choose(ctx, s10, run.LatestOptions{})
			require.ErrorIs(t, err, loader.ErrIncomplete)

			s99, err := r.Step(99)
			require.NoError(t, err)
			_, err = run.Choose(ctx, s99, run.LatestOptions{})
			require.ErrorIs(t, err, run.ErrNothingStored)

			other, err := st.Sub("fresh")
			require.NoError(t, err)
			ch, err = run.Choose(ctx, other, run.LatestOptions{})
			require.NoError(t, err)
			assert.True(t, ch.Empty)
			assert.Nil(t, ch.Checkpoint)
			assert.True(t, errors.Is(ch.NotACheckpoint, loader.ErrNoCheckpoint))
		})
	}
}

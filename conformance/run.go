package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/internal/testkit/damage"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// runLayerCases are the rules of a run of checkpoints (package run): choosing,
// a fresh start against a refusal, falling back past damage, and ranks
// agreeing on one step through the store coordinator, on the backend under
// test.
var runLayerCases = []testCase{
	checkpointCase("run/fresh-start", caseRunFresh),
	checkpointCase("run/refused-when-none-valid", caseRunRefused),
	checkpointCase("run/fallback-says-why", caseRunFallback),
	checkpointCase("run/choose", caseRunChoose),
	checkpointCase("run/ranks-agree-through-the-store", caseRunRanksAgree),
	checkpointCase("run/ranks-share-refusal-and-fresh-start", caseRunRanksShare),
	checkpointCase("run/only-coordinator-objects-is-fresh", caseRunOnlyCoordinator),
	checkpointCase("run/resume-url", caseRunResumeURL),
}

// runSteps saves newFixture(step) as step's checkpoint of the run at st,
// sharded over world ranks, for each step, and returns the fixtures.
func runSteps(t T, st *backend.Store, world int, steps ...int64) map[int64]*fixture {
	t.Helper()
	out := map[int64]*fixture{}
	for _, s := range steps {
		out[s] = newFixture(uint64(s))
		_, err := run.New(st).SaveLocal(context.Background(), s, out[s].saveState(world), saver.Options{})
		require.NoError(t, err, "save step %d to %s", s, st)
	}
	return out
}

// rankLoad is a run.LoadFunc loading rank's targets (of world, as f
// shards them) into fresh targets each call; got receives the last ones
// and calls counts the calls.
type rankLoad struct {
	f           *fixture
	rank, world int
	got         *statedict.StateDict
	calls       atomic.Int32
}

func (l *rankLoad) load() run.LoadFunc {
	return run.Into(func() []*statedict.StateDict {
		l.calls.Add(1)
		l.got = l.f.targets(l.world)[l.rank]
		return []*statedict.StateDict{l.got}
	}, quietLoad())
}

// requireLoaded checks that the last targets hold rank's shard of want
// (the lazily absent optimizer state left as the targets had it: zeros).
func (l *rankLoad) requireLoaded(t T, want *fixture) {
	t.Helper()
	require.NotNil(t, l.got, "rank %d loaded nothing", l.rank)
	for k, s := range l.got.Tensors {
		full, ok := want.full[k]
		if !ok || want.isLazyKey(k) {
			require.Equal(t, make([]byte, len(s.Data)), s.Data, "rank %d key %q must be left untouched", l.rank, k)
			continue
		}
		require.Equal(t, want.shard(k, full, l.rank, l.world).Data, s.Data, "rank %d key %q bytes differ", l.rank, k)
	}
	for k, b := range l.got.Bytes {
		require.Equal(t, want.bytes[k], b, "rank %d bytes key %q", l.rank, k)
	}
}

func whys(ss []run.Skipped) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, fmt.Sprintf("%s:%s", s.Entry.Name, s.Why))
	}
	return out
}

// stepStore is the store of step's checkpoint in the run at st.
func stepStore(t T, st *backend.Store, step int64) *backend.Store {
	t.Helper()
	s, err := run.New(st).Step(step)
	require.NoError(t, err)
	return s
}

// breakMetadata replaces the metadata object of step's checkpoint with
// bytes that do not parse: committed, but not valid.
func breakMetadata(t T, st *backend.Store, step int64) {
	t.Helper()
	require.NoError(t, stepStore(t, st, step).PutBytes(context.Background(), metadata.ObjectKey, []byte("{not json"), backend.PutOptions{}))
}

// A run under which nothing is stored is not resumed from: without
// AllowFresh it is ErrNothingStored (a mistyped URL), with it a fresh
// start; a run holding only an abandoned save starts fresh and says what it
// passed over. Load is never called.
func caseRunFresh(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	r := run.New(st)
	l := &rankLoad{f: newFixture(1), world: 1}

	_, err := r.Resume(ctx, run.ResumeOptions{Load: l.load()})
	require.ErrorIs(t, err, run.ErrNothingStored)
	assert.Equal(t, ckpterr.NotFound, ckpterr.ClassOf(err))

	res, err := r.Resume(ctx, run.ResumeOptions{Load: l.load(), AllowFresh: true})
	require.NoError(t, err)
	assert.True(t, res.Fresh)
	assert.True(t, res.Empty)
	assert.Nil(t, res.Checkpoint)

	runSteps(t, st, 1, 5)
	require.NoError(t, stepStore(t, st, 5).Delete(ctx, metadata.ObjectKey)) // an abandoned save
	res, err = r.Resume(ctx, run.ResumeOptions{Load: l.load()})
	require.NoError(t, err)
	assert.True(t, res.Fresh)
	assert.False(t, res.Empty)
	assert.Equal(t, []string{"step-00000005:uncommitted"}, whys(res.Skipped))
	assert.Zero(t, l.calls.Load(), "nothing was loaded")
}

// Committed checkpoints of which none is valid are refused, never a fresh
// start: a *RefusedError of class bad-checkpoint naming the newest one and
// its problem; Latest (`ckpt latest`) refuses alike.
func caseRunRefused(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	r := run.New(st)
	runSteps(t, st, 1, 10, 20)
	breakMetadata(t, st, 10)
	breakMetadata(t, st, 20)
	l := &rankLoad{f: newFixture(1), world: 1}
	_, err := r.Resume(ctx, run.ResumeOptions{Load: l.load(), AllowFresh: true})
	require.ErrorIs(t, err, run.ErrNoValidCheckpoint)
	assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	var re *run.RefusedError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 2, re.Committed)
	assert.Equal(t, "step-00000020", re.Newest.Entry.Name)
	assert.Equal(t, run.Invalid, re.Newest.Why)
	assert.ErrorIs(t, err, metadata.ErrInvalid, "the newest one's problem is in the chain")
	assert.Zero(t, l.calls.Load())

	_, skipped, err := r.Latest(ctx, run.LatestOptions{})
	require.ErrorIs(t, err, run.ErrNoValidCheckpoint)
	assert.Equal(t, []string{"step-00000020:invalid", "step-00000010:invalid"}, whys(skipped))
}

// Past an uncommitted step and one with damaged data, Resume loads the
// next older valid checkpoint and says what it skipped and why.
func caseRunFallback(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	r := run.New(st)
	fx := runSteps(t, st, 1, 10, 20, 30)
	damage.FlipRankData(t, stepStore(t, st, 20), 0)
	require.NoError(t, stepStore(t, st, 30).Delete(ctx, metadata.ObjectKey))

	l := &rankLoad{f: fx[10], world: 1}
	var logged []string
	res, err := r.Resume(ctx, run.ResumeOptions{Load: l.load(),
		Logf: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }})
	require.NoError(t, err)
	assert.False(t, res.Fresh)
	assert.Equal(t, int64(10), res.Entry.Step)
	assert.Equal(t, r.StepURL(10), res.Checkpoint.URL())
	assert.Equal(t, []string{"step-00000030:uncommitted", "step-00000020:damaged"}, whys(res.Skipped))
	require.ErrorIs(t, res.Skipped[1].Err, loader.ErrChecksum)
	assert.Equal(t, int32(2), l.calls.Load(), "one attempt at step 20, one at step 10")
	l.requireLoaded(t, fx[10])
	assert.Contains(t, strings.Join(logged, "\n"), "falling back to the next older valid checkpoint")
}

// Choose is the one rule for "checkpoint or run": a run URL opens its
// newest valid step (saying what it passed over), a checkpoint's URL that
// checkpoint; data without metadata is an incomplete checkpoint; a
// step-named URL under which nothing is stored is a typo; an empty URL is
// Empty (the caller decides).
func caseRunChoose(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	r := run.New(st)
	runSteps(t, st, 1, 10, 20, 30)
	breakMetadata(t, st, 30)

	ch, err := run.Choose(ctx, st, run.LatestOptions{})
	require.NoError(t, err)
	require.NotNil(t, ch.Run, "a run URL is a run")
	assert.Equal(t, "step-00000020", ch.Entry.Name)
	assert.Equal(t, r.StepURL(20), ch.Checkpoint.URL())
	assert.Equal(t, []string{"step-00000030:invalid"}, whys(ch.Skipped))

	s10 := stepStore(t, st, 10)
	ch, err = run.Choose(ctx, s10, run.LatestOptions{})
	require.NoError(t, err)
	assert.Nil(t, ch.Run, "a step's URL is a checkpoint")
	assert.Equal(t, int64(10), ch.Checkpoint.Metadata().Training.Iteration)

	require.NoError(t, s10.Delete(ctx, metadata.ObjectKey))
	_, err = run.Choose(ctx, s10, run.LatestOptions{})
	require.ErrorIs(t, err, loader.ErrIncomplete)

	_, err = run.Choose(ctx, stepStore(t, st, 99), run.LatestOptions{})
	require.ErrorIs(t, err, run.ErrNothingStored)

	other, err := st.Sub("fresh")
	require.NoError(t, err)
	ch, err = run.Choose(ctx, other, run.LatestOptions{})
	require.NoError(t, err)
	assert.True(t, ch.Empty)
	assert.Nil(t, ch.Checkpoint)
	assert.ErrorIs(t, ch.NotACheckpoint, loader.ErrNoCheckpoint)
}

// fastPolls polls the store coordinator quickly.
var fastPolls = coordinator.StoreOptions{PollInterval: time.Millisecond, MaxPollInterval: 20 * time.Millisecond, Timeout: 2 * time.Minute}

// resumeRanks runs Resume on world ranks, goroutines that share nothing but
// the run's store and coordinate through it.
func resumeRanks(t T, st *backend.Store, world int, opts func(rank int) run.ResumeOptions) ([]*run.Resumed, []error) {
	t.Helper()
	ctx := context.Background()
	group := fmt.Sprintf("resume-%d", time.Now().UnixNano())
	res, errs := make([]*run.Resumed, world), make([]error, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			r := run.New(st)
			c, err := r.NewCoordinator(group, rank, world, fastPolls)
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
// ranks, which loaded step 20, load step 10 too and say why; the
// coordinator's objects are gone afterwards.
func caseRunRanksAgree(t T, h *Harness) {
	const world = 3
	st := h.NewStore(t)
	fx := runSteps(t, st, world, 10, 20)
	damage.FlipRankData(t, stepStore(t, st, 20), 2)

	loads := make([]*rankLoad, world)
	for rank := range loads {
		loads[rank] = &rankLoad{f: fx[10], rank: rank, world: world}
	}
	res, errs := resumeRanks(t, st, world, func(rank int) run.ResumeOptions {
		return run.ResumeOptions{Load: loads[rank].load()}
	})
	for rank := range world {
		require.NoError(t, errs[rank], "rank %d", rank)
		assert.Equal(t, int64(10), res[rank].Entry.Step, "rank %d", rank)
		loads[rank].requireLoaded(t, fx[10])
		assert.Equal(t, int32(2), loads[rank].calls.Load(), "rank %d: step 20, then step 10", rank)
	}
	assert.Equal(t, []string{"step-00000020:other-rank"}, whys(res[0].Skipped))
	assert.Equal(t, []string{"step-00000020:other-rank"}, whys(res[1].Skipped))
	assert.Equal(t, []string{"step-00000020:damaged"}, whys(res[2].Skipped))

	n := 0
	require.NoError(t, st.List(context.Background(), run.CoordPrefix+"/", func(backend.ObjectInfo) error { n++; return nil }))
	assert.Zero(t, n, "rank 0 removed the coordinator's group")
}

// Rank 0's refusal reaches every rank, classified, and a fresh start is
// every rank's.
func caseRunRanksShare(t T, h *Harness) {
	const world = 2
	st := h.NewStore(t)
	var calls atomic.Int32
	opts := func(rank int) run.ResumeOptions {
		l := &rankLoad{f: newFixture(1), rank: rank, world: world}
		return run.ResumeOptions{Load: func(ctx context.Context, c *loader.Checkpoint) (*loader.Report, error) {
			calls.Add(1)
			return l.load()(ctx, c)
		}, AllowFresh: true}
	}
	res, errs := resumeRanks(t, st, world, opts)
	for rank := range world {
		require.NoError(t, errs[rank], "rank %d", rank)
		assert.True(t, res[rank].Fresh && res[rank].Empty, "rank %d", rank)
	}

	runSteps(t, st, world, 10)
	breakMetadata(t, st, 10)
	_, errs = resumeRanks(t, st, world, opts)
	for rank := range world {
		require.ErrorIs(t, errs[rank], run.ErrNoValidCheckpoint, "rank %d", rank)
		assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(errs[rank]), "rank %d", rank)
	}
	assert.Zero(t, calls.Load())
}

// A run holding nothing but the store coordinator's objects (a multi-rank
// resume of a fresh run whose rank 0 never removed its group) is a fresh
// start, never a refusal nor an incomplete checkpoint: Resume, Choose and
// ResumeURL agree.
func caseRunOnlyCoordinator(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	require.NoError(t, st.PutBytes(ctx, run.CoordPrefix+"/resume-1/0/0", []byte("x"), backend.PutOptions{}))
	l := &rankLoad{f: newFixture(1), world: 1}

	res, err := run.New(st).Resume(ctx, run.ResumeOptions{Load: l.load()})
	require.NoError(t, err)
	assert.True(t, res.Fresh)
	assert.Empty(t, res.Skipped)

	ch, err := run.Choose(ctx, st, run.LatestOptions{})
	require.NoError(t, err)
	assert.NotNil(t, ch.Run)
	assert.Nil(t, ch.Checkpoint)

	res, err = run.ResumeURL(ctx, st, run.ResumeOptions{Load: l.load()})
	require.NoError(t, err)
	assert.True(t, res.Fresh)
	assert.Zero(t, l.calls.Load(), "nothing was loaded")
}

// ResumeURL follows Choose's rule: a checkpoint's URL is loaded as it is
// (no choice, no fallback: its damage is the error), a run's URL is
// resumed (Run.Resume, falling back past damage), a step-named URL under
// which nothing is stored is ErrNothingStored even with AllowFresh.
func caseRunResumeURL(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	fx := runSteps(t, st, 1, 10, 20)
	damage.FlipRankData(t, stepStore(t, st, 20), 0)

	l := &rankLoad{f: fx[10], world: 1}
	res, err := run.ResumeURL(ctx, st, run.ResumeOptions{Load: l.load()})
	require.NoError(t, err)
	assert.Equal(t, int64(10), res.Entry.Step)
	assert.Equal(t, []string{"step-00000020:damaged"}, whys(res.Skipped))
	l.requireLoaded(t, fx[10])

	l = &rankLoad{f: fx[10], world: 1}
	res, err = run.ResumeURL(ctx, stepStore(t, st, 10), run.ResumeOptions{Load: l.load()})
	require.NoError(t, err)
	assert.Equal(t, int64(10), res.Entry.Step, "the step of the checkpoint's name")
	assert.Equal(t, "step-00000010", res.Entry.Name)
	assert.Empty(t, res.Skipped)
	l.requireLoaded(t, fx[10])

	_, err = run.ResumeURL(ctx, stepStore(t, st, 20), run.ResumeOptions{Load: l.load()})
	require.ErrorIs(t, err, loader.ErrChecksum, "a checkpoint's URL never falls back")

	_, err = run.ResumeURL(ctx, stepStore(t, st, 99), run.ResumeOptions{Load: l.load(), AllowFresh: true})
	require.ErrorIs(t, err, run.ErrNothingStored)
}

package conformance

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/saver"
)

// checkpointCases are the resume-rule cases, run through the public save
// and load API on the backend under test.
var checkpointCases = []testCase{
	checkpointCase("checkpoint/reshard-round-trip", caseReshard),
	checkpointCase("checkpoint/metadata-read-once", caseMetadataOnce),
	checkpointCase("checkpoint/uncommitted-refused", caseUncommitted),
	checkpointCase("checkpoint/flipped-byte-detected", caseFlippedByte),
	checkpointCase("checkpoint/partial-optimizer-rejected", casePartial),
	checkpointCase("checkpoint/layout-mismatch-rejected", caseLayout),
	checkpointCase("checkpoint/shard-gap-rejected", caseCoverage),
	checkpointCase("checkpoint/no-save-optimizer", caseNoSaveOptimizer),
	checkpointCase("checkpoint/no-load-optimizer", caseNoLoadOptimizer),
	checkpointCase("checkpoint/interrupted-save", caseInterruptedSave),
	checkpointCase("checkpoint/dcp-lazy-moe-torch2", caseDCPLazy("lazy_moe2")),
	checkpointCase("checkpoint/dcp-sparse-optim-torch1", caseDCPLazy("sparse_optim")),
	checkpointCase("checkpoint/dcp-partial-rejected", caseDCPPartial),
}

// checkpointCase adapts a case that only needs the harness.
func checkpointCase(name string, run func(t T, h *Harness)) testCase {
	return testCase{name, func(t T, e *env) { run(t, e.h) }}
}

func quietLoad() loader.Options { return loader.Options{Logger: discardLogger()} }

func save(t T, st *backend.Store, f *fixture, world int, opts saver.Options) *saver.Result {
	t.Helper()
	res, err := saver.SaveLocal(context.Background(), st, f.saveState(world), opts)
	require.NoError(t, err, "save %d ranks to %s", world, st)
	return res
}

func caseReshard(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(1)
	res := save(t, st, f, 4, saver.Options{Iteration: 12})

	// A replicated tensor is stored once.
	e := res.Metadata.Tensor("model.norm.scale")
	require.NotNil(t, e)
	require.Len(t, e.Chunks, 1, "replicated tensor must be written once")
	var unique, stored int64
	for _, tn := range f.full {
		unique += int64(len(tn.Data))
	}
	for _, b := range f.bytes {
		unique += int64(len(b))
	}
	for _, o := range res.Metadata.Objects {
		stored += o.Size
	}
	require.Equal(t, unique, stored, "data objects must hold each byte exactly once")

	for _, world := range []int{1, 2, 3, 4} {
		targets := f.targets(world)
		rep, err := loader.Load(context.Background(), st, targets, quietLoad())
		require.NoError(t, err, "load with %d ranks", world)
		f.check(t, targets, f.isLazyKey)
		assert.Equal(t, int64(12), rep.Iteration)
		assert.Equal(t, []string{f.lazyParam}, rep.LazyParams, "lazily-absent state reported")
		assert.True(t, rep.OptimizerLoaded)
		assert.LessOrEqual(t, float64(rep.BytesRead), 1.05*float64(rep.BytesNeeded)+1, "read amplification")
	}
}

func caseMetadataOnce(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(2)
	save(t, st, f, 3, saver.Options{})
	counter := instrument.Wrap(st.Driver())
	counted := st.WithDriver(counter)
	_, err := loader.Load(context.Background(), counted, f.targets(2), quietLoad())
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.CountKeySuffix(instrument.OpRead, metadata.ObjectKey), "metadata must be read exactly once per load")
	require.Equal(t, int64(0), counter.Count(instrument.OpPut), "a load writes nothing")
}

func caseUncommitted(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(3)
	save(t, st, f, 2, saver.Options{})
	require.NoError(t, st.Delete(context.Background(), metadata.ObjectKey))
	targets := f.targets(2)
	before := snapshot(targets)
	_, err := loader.Load(context.Background(), st, targets, quietLoad())
	require.ErrorIs(t, err, loader.ErrIncomplete)
	requireUnchanged(t, before, targets)
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RuleUncommitted, rep.Problems[0].Rule)
}

func caseFlippedByte(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	f := newFixture(4)
	res := save(t, st, f, 2, saver.Options{})
	e := res.Metadata.Tensor("model.embed.weight")
	ch := e.Chunks[0]
	data, err := st.ReadAll(ctx, ch.Object, 0)
	require.NoError(t, err)
	data[ch.Offset+3] ^= 0x40
	require.NoError(t, st.PutBytes(ctx, ch.Object, data, backend.PutOptions{}))

	targets := f.targets(2)
	before := snapshot(targets)
	_, err = loader.Load(ctx, st, targets, quietLoad())
	require.ErrorIs(t, err, loader.ErrChecksum)
	msg := err.Error()
	assert.Contains(t, msg, "model.embed.weight")
	assert.Contains(t, msg, ch.Object)
	assert.Contains(t, msg, "offset")
	requireUnchanged(t, before, targets)

	rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RuleChecksum, rep.Problems[0].Rule)
}

// rewriteMetadata alters a real saved checkpoint's metadata in place.
func rewriteMetadata(t T, st *backend.Store, mutate func(md *metadata.Checkpoint)) {
	t.Helper()
	ctx := context.Background()
	raw, err := st.ReadAll(ctx, metadata.ObjectKey, 0)
	require.NoError(t, err)
	md, err := metadata.Decode(raw)
	require.NoError(t, err)
	mutate(md)
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, enc, backend.PutOptions{}))
}

func listing(t T, st *backend.Store) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	require.NoError(t, st.List(context.Background(), "", func(o backend.ObjectInfo) error {
		out[o.Key] = o.Size
		return nil
	}))
	return out
}

// expectRejected loads into fresh targets and checks the error, that the
// targets are unchanged and that the store is unchanged.
func expectRejected(t T, st *backend.Store, f *fixture, opts loader.Options, want error, mentions ...string) {
	t.Helper()
	targets := f.targets(2)
	before := snapshot(targets)
	objects := listing(t, st)
	_, err := loader.Load(context.Background(), st, targets, opts)
	require.ErrorIs(t, err, want)
	for _, m := range mentions {
		assert.Contains(t, err.Error(), m)
	}
	requireUnchanged(t, before, targets)
	require.Equal(t, objects, listing(t, st), "a failed load must not change the store")
}

func casePartial(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(5)
	save(t, st, f, 2, saver.Options{})
	rewriteMetadata(t, st, func(md *metadata.Checkpoint) {
		for i, e := range md.Tensors {
			if e.Key == "optimizer.state.embed.weight.exp_avg_sq" {
				md.Tensors = append(md.Tensors[:i], md.Tensors[i+1:]...)
				return
			}
		}
		t.Fatalf("fixture lacks the slot to remove")
	})
	expectRejected(t, st, f, quietLoad(), loader.ErrPartialOptimizerState, "embed.weight", "optimizer.state.embed.weight.exp_avg_sq")
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RulePartialOptimizer, rep.Problems[0].Rule)
}

func caseLayout(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(6)
	save(t, st, f, 2, saver.Options{})
	rewriteMetadata(t, st, func(md *metadata.Checkpoint) {
		for i := range md.Tensors {
			md.Tensors[i].Key = strings.Replace(md.Tensors[i].Key, "optimizer.state.", "optimizer.state.module.", 1)
		}
	})
	expectRejected(t, st, f, quietLoad(), loader.ErrLayoutMismatch, "optimizer.state.module.")
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RuleLayoutMismatch, rep.Problems[0].Rule)
}

func caseCoverage(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(7)
	save(t, st, f, 4, saver.Options{})
	rewriteMetadata(t, st, func(md *metadata.Checkpoint) {
		for i := range md.Tensors {
			if md.Tensors[i].Key == "model.embed.weight" {
				md.Tensors[i].Chunks = md.Tensors[i].Chunks[:len(md.Tensors[i].Chunks)-1]
			}
		}
	})
	expectRejected(t, st, f, quietLoad(), planner.ErrCoverage, "model.embed.weight", "gap")
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RuleShardCoverage, rep.Problems[0].Rule)
}

func caseNoSaveOptimizer(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(8)
	res := save(t, st, f, 2, saver.Options{Iteration: 42, NoSaveOptimizer: true})
	require.Equal(t, metadata.OptimizerOmitted, res.Metadata.Training.Optimizer)
	require.Equal(t, int64(42), res.Metadata.Training.Iteration)
	for _, e := range res.Metadata.Tensors {
		require.False(t, isOptimizerKey(e.Key), "optimizer key %q saved despite NoSaveOptimizer", e.Key)
	}
	require.NotNil(t, res.Metadata.BytesValue("scheduler.last_epoch"), "scheduler must still be saved")

	targets := f.targets(3)
	rep, err := loader.Load(context.Background(), st, targets, quietLoad())
	require.NoError(t, err)
	require.Equal(t, int64(42), rep.Iteration)
	require.False(t, rep.OptimizerLoaded)
	f.check(t, targets, isOptimizerKey)
}

func caseNoLoadOptimizer(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(9)
	save(t, st, f, 2, saver.Options{Iteration: 9})
	targets := f.targets(2)
	opts := quietLoad()
	opts.NoLoadOptimizer = true
	rep, err := loader.Load(context.Background(), st, targets, opts)
	require.NoError(t, err)
	require.Equal(t, int64(9), rep.Iteration)
	require.False(t, rep.OptimizerLoaded)
	f.check(t, targets, isOptimizerKey)
}

// cancelOnPut cancels a context when the first data object write starts.
type cancelOnPut struct {
	backend.Driver
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelOnPut) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	c.once.Do(c.cancel)
	return c.Driver.Put(ctx, key, size, r, opts)
}

func caseInterruptedSave(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(10)
	prev, err := st.Sub("step-1")
	require.NoError(t, err)
	save(t, prev, f, 2, saver.Options{Iteration: 1})

	next, err := st.Sub("step-2")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	interrupted := next.WithDriver(&cancelOnPut{Driver: next.Driver(), cancel: cancel})
	_, err = saver.SaveLocal(ctx, interrupted, f.saveState(2), saver.Options{Iteration: 2})
	require.Error(t, err)
	require.True(t, errors.Is(err, context.Canceled), "want a cancellation error, got %v", err)

	_, err = loader.Open(context.Background(), next)
	require.True(t, errors.Is(err, loader.ErrIncomplete) || errors.Is(err, loader.ErrNoCheckpoint), "interrupted save must not be committed: %v", err)
	targets := f.targets(2)
	rep, err := loader.Load(context.Background(), prev, targets, quietLoad())
	require.NoError(t, err, "the previous checkpoint must stay loadable")
	require.Equal(t, int64(1), rep.Iteration)
	f.check(t, targets, f.isLazyKey)
}

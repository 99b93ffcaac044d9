package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// checkpointCases are the resume-rule cases, run through the public save
// and load API on the backend under test.
var checkpointCases = []testCase{
	checkpointCase("checkpoint/reshard-round-trip", caseReshard),
	checkpointCase("checkpoint/lazy-state-pruned", caseLazyPruned),
	checkpointCase("checkpoint/lazy-only-rank-loads", caseLazyOnlyRank),
	checkpointCase("checkpoint/metadata-read-once", caseMetadataOnce),
	checkpointCase("checkpoint/uncommitted-refused", caseUncommitted),
	checkpointCase("checkpoint/flipped-byte-detected", caseFlippedByte),
	checkpointCase("checkpoint/partial-optimizer-rejected", casePartial),
	checkpointCase("checkpoint/layout-mismatch-rejected", caseLayout),
	checkpointCase("checkpoint/shard-gap-rejected", caseCoverage),
	checkpointCase("checkpoint/model-keys-strict", caseModelKeysStrict),
	checkpointCase("checkpoint/missing-object-detected", caseMissingObject),
	checkpointCase("checkpoint/no-save-optimizer", caseNoSaveOptimizer),
	checkpointCase("checkpoint/no-load-optimizer", caseNoLoadOptimizer),
	checkpointCase("checkpoint/weights-only-needs-no-load-optimizer", caseWeightsOnly),
	checkpointCase("checkpoint/interrupted-save", caseInterruptedSave),
	checkpointCase("checkpoint/dcp-lazy-moe-torch2", caseDCPLazy("lazy_moe2")),
	checkpointCase("checkpoint/dcp-sparse-optim-torch1", caseDCPLazy("sparse_optim")),
	checkpointCase("checkpoint/dcp-partial-rejected", caseDCPPartial),
	checkpointCase("checkpoint/dcp-adafactor-torch2.14", caseDCPLazy("torch214_adafactor")),
	checkpointCase("checkpoint/dcp-muon-adamw-torch2.14", caseDCPLazy("torch214_muon_adamw")),
	checkpointCase("checkpoint/dcp-adafactor-partial-torch2.14", caseDCPPartialOf("torch214_adafactor_partial")),
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
		before := snapshot(targets)
		rep, err := loader.Load(context.Background(), st, targets, quietLoad())
		require.NoError(t, err, "load with %d ranks", world)
		f.check(t, before, targets, f.isLazyKey)
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
	requireVerifyProblem(t, st, false, loader.RuleUncommitted)
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

	// The default one-pass load fails naming key, object and offset; it
	// says the targets were partly filled unless it left them as they were
	// (the corrupt chunk was read, into a buffer, before anything landed).
	targets := f.targets(2)
	before := snapshot(targets)
	_, err = loader.Load(ctx, st, targets, quietLoad())
	require.ErrorIs(t, err, loader.ErrChecksum)
	if !errors.Is(err, loader.ErrTargetsPartlyFilled) {
		requireUnchanged(t, before, targets)
	}
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err), "a flipped byte makes a bad checkpoint: %v", err)
	msg := err.Error()
	assert.Contains(t, msg, "model.embed.weight")
	assert.Contains(t, msg, ch.Object)
	assert.Contains(t, msg, fmt.Sprintf("offset %d", ch.Offset))

	// A Transactional load leaves the targets exactly as they were.
	targets = f.targets(2)
	before = snapshot(targets)
	opts := quietLoad()
	opts.Transactional = true
	_, err = loader.Load(ctx, st, targets, opts)
	require.ErrorIs(t, err, loader.ErrChecksum)
	require.NotErrorIs(t, err, loader.ErrTargetsPartlyFilled)
	assert.Contains(t, err.Error(), "model.embed.weight")
	requireUnchanged(t, before, targets)

	requireVerifyProblem(t, st, true, loader.RuleChecksum)
}

// requireVerifyProblem checks that verify (deep or not) calls the
// checkpoint at st not resumable, for rule first.
func requireVerifyProblem(t T, st *backend.Store, deep bool, rule string) {
	t.Helper()
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{Deep: deep})
	require.NoError(t, err)
	require.False(t, rep.Resumable, "verify must refuse the checkpoint (%s)", rule)
	require.NotEmpty(t, rep.Problems)
	require.Equal(t, rule, rep.Problems[0].Rule, "%+v", rep.Problems)
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
	expectRejectedInto(t, st, f.targets(2), opts, want, mentions...)
}

// expectRejectedInto is expectRejected with the caller's targets.
func expectRejectedInto(t T, st *backend.Store, targets []*statedict.StateDict, opts loader.Options, want error, mentions ...string) {
	t.Helper()
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
	requireVerifyProblem(t, st, false, loader.RulePartialOptimizer)
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
	requireVerifyProblem(t, st, false, loader.RuleLayoutMismatch)
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
	requireVerifyProblem(t, st, false, loader.RuleShardCoverage)

	// Chunks that overlap: the last one said to start a row earlier.
	over, err := st.Sub("overlap")
	require.NoError(t, err)
	save(t, over, f, 4, saver.Options{})
	rewriteMetadata(t, over, func(md *metadata.Checkpoint) {
		for i := range md.Tensors {
			if e := &md.Tensors[i]; e.Key == "model.embed.weight" {
				last := &e.Chunks[len(e.Chunks)-1]
				last.Offsets[0]--
			}
		}
	})
	expectRejected(t, over, f, quietLoad(), planner.ErrCoverage, "model.embed.weight", "overlap")
	requireVerifyProblem(t, over, false, loader.RuleShardCoverage)
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

	loadWithoutOptimizer(t, st, f, 3, 42, quietLoad())
}

// loadWithoutOptimizer loads into fresh targets for world ranks and checks
// that the iteration and every key outside the optimizer were restored
// while the optimizer targets were left as they were.
func loadWithoutOptimizer(t T, st *backend.Store, f *fixture, world int, iteration int64, opts loader.Options) {
	t.Helper()
	targets := f.targets(world)
	freshOptimizer(targets)
	before := snapshot(targets)
	rep, err := loader.Load(context.Background(), st, targets, opts)
	require.NoError(t, err)
	require.Equal(t, iteration, rep.Iteration)
	require.False(t, rep.OptimizerLoaded)
	f.check(t, before, targets, isOptimizerKey)
}

func caseNoLoadOptimizer(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(9)
	save(t, st, f, 2, saver.Options{Iteration: 9})
	opts := quietLoad()
	opts.NoLoadOptimizer = true
	loadWithoutOptimizer(t, st, f, 2, 9, opts)
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
	before := snapshot(targets)
	rep, err := loader.Load(context.Background(), prev, targets, quietLoad())
	require.NoError(t, err, "the previous checkpoint must stay loadable")
	require.Equal(t, int64(1), rep.Iteration)
	f.check(t, before, targets, f.isLazyKey)
}

// lazyKeys returns the optimizer keys of f's lazily-absent parameter.
func (f *fixture) lazyKeys() []string {
	var out []string
	for _, slot := range saver.DefaultOptimizerSlots {
		out = append(out, statedict.StateKey(statedict.DefaultOptimizerPrefix, f.lazyParam, slot))
	}
	return out
}

// logLines is a slog.Logger recording each message with its attributes.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, string(p))
		return len(p), nil
	}), nil))
}

// mentioning counts the recorded lines that contain s.
func (l *logLines) mentioning(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

type writerFunc func(p []byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// caseLazyPruned: resume rule 1 on its own. One trainable parameter (an
// unrouted expert, declared by its model key) was saved without any
// optimizer state while the others have full AdamW state; a resuming job
// asks for fresh state of every parameter. The load succeeds at every world
// size, the pruned parameter's optimizer target is left exactly as it was,
// everything else loads bit for bit, the report names the parameter
// exactly once and one log line says so; verify calls it information.
func caseLazyPruned(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	f := newFixture(11)
	res := save(t, st, f, 2, saver.Options{Iteration: 5})
	require.NotNil(t, res.Metadata.Tensor("model."+f.lazyParam), "the checkpoint declares the pruned parameter")
	for _, k := range f.lazyKeys() {
		require.Nil(t, res.Metadata.Tensor(k), "the pruned parameter has no optimizer state (%s)", k)
	}
	require.NotNil(t, res.Metadata.Tensor("optimizer.state.experts.0.weight.exp_avg_sq"), "its routed sibling has full state")
	require.Equal(t, metadata.OptimizerSaved, res.Metadata.Training.Optimizer)

	for _, world := range []int{1, 2, 3} {
		targets := f.targets(world)
		freshOptimizer(targets)
		before := snapshot(targets)
		logs := &logLines{}
		opts := quietLoad()
		opts.Logger = logs.logger()
		rep, err := loader.Load(ctx, st, targets, opts)
		require.NoError(t, err, "a lazily-absent parameter must not fail the load (%d ranks)", world)
		require.Equal(t, []string{f.lazyParam}, rep.LazyParams, "the pruned parameter, reported exactly once (%d ranks)", world)
		require.Positive(t, rep.LazyKeys)
		require.True(t, rep.OptimizerLoaded)
		require.Equal(t, int64(5), rep.Iteration)
		require.Equal(t, 1, logs.mentioning(f.lazyParam), "one log line names the pruned parameter: %q", logs.lines)
		for r := range targets {
			for _, k := range f.lazyKeys() {
				if s, ok := targets[r].Tensors[k]; ok {
					require.Equal(t, before[r].Tensors[k].Data, s.Data, "rank %d: %s must be left fresh", r, k)
				}
			}
		}
		f.check(t, before, targets, f.isLazyKey)
	}

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.True(t, vr.Resumable, "%+v", vr.Problems)
	require.Len(t, vr.Info, 1, "%+v", vr.Info)
	require.Equal(t, loader.RuleLazyOptimizer, vr.Info[0].Rule)
	require.Contains(t, vr.Info[0].Message, f.lazyParam)
}

// caseLazyOnlyRank: the exception to resume rule 3. A job (or a rank)
// whose only trainable parameter is the unrouted expert has no saved state
// for any of its parameters, but the saved state belongs to the
// checkpoint's other parameters: not a layout mismatch, it loads under
// rule 1.
func caseLazyOnlyRank(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(12)
	save(t, st, f, 2, saver.Options{Iteration: 6})
	sd := statedict.New()
	w := f.full["model."+f.lazyParam]
	sd.Tensors["model."+f.lazyParam] = statedict.Whole(statedict.NewTensor(w.DType, w.Shape...))
	for _, k := range f.lazyKeys() {
		tn := statedict.NewTensor(statedict.Float32)
		if !strings.HasSuffix(k, ".step") {
			tn = statedict.NewTensor(statedict.Float32, w.Shape...)
		}
		sd.Tensors[k] = statedict.Whole(tn)
	}
	targets := []*statedict.StateDict{sd}
	freshOptimizer(targets)
	before := snapshot(targets)
	rep, err := loader.Load(context.Background(), st, targets, quietLoad())
	require.NoError(t, err, "a target holding only lazily-absent parameters is not a layout mismatch")
	require.Equal(t, []string{f.lazyParam}, rep.LazyParams)
	require.NotEmpty(t, rep.ExtraKeys, "the other parameters' keys are reported as extra")
	f.check(t, before, targets, f.isLazyKey)
}

// caseModelKeysStrict: resume rule 5. A target key missing from the
// checkpoint fails (naming it) unless declared frozen, in which case it is
// left untouched and reported; checkpoint keys no target asks for are
// reported, not fatal; a dtype or shape that differs fails naming the key.
func caseModelKeysStrict(t T, h *Harness) {
	ctx := context.Background()
	st := h.NewStore(t)
	f := newFixture(13)
	save(t, st, f, 2, saver.Options{})
	const added, dropped = "model.new_head.weight", "model.layer_int8.weight"
	withNewHead := func() []*statedict.StateDict {
		targets := f.targets(2)
		head := detbytes.Tensor(statedict.NewTensor(statedict.Float32, 4, 3), 99)
		for r := range targets {
			targets[r].Tensors[added] = statedict.RowShard(head, r, 2)
			delete(targets[r].Tensors, dropped)
		}
		return targets
	}
	expectRejectedInto(t, st, withNewHead(), quietLoad(), loader.ErrMissingKeys, added)

	targets := withNewHead()
	before := snapshot(targets)
	opts := quietLoad()
	opts.Frozen = []string{added}
	rep, err := loader.Load(ctx, st, targets, opts)
	require.NoError(t, err, "a missing key declared frozen")
	require.Equal(t, []string{added}, rep.FrozenMissing)
	require.Contains(t, rep.ExtraKeys, dropped, "a checkpoint key no target asks for is reported")
	f.check(t, before, targets, func(k string) bool { return k == added || f.isLazyKey(k) })

	// model.embed.weight is float32 [10 4] in the checkpoint.
	for _, other := range []*statedict.Tensor{
		statedict.NewTensor(statedict.Float64, 10, 4),
		statedict.NewTensor(statedict.Float32, 10, 5),
	} {
		targets := f.targets(2)
		for r := range targets {
			targets[r].Tensors["model.embed.weight"] = statedict.RowShard(other, r, 2)
		}
		expectRejectedInto(t, st, targets, quietLoad(), loader.ErrTargetMismatch, "model.embed.weight")
	}
}

// caseMissingObject: a committed checkpoint whose data object was deleted,
// or truncated, is a bad checkpoint: verify names the object
// (missing-object, object-size), and a load fails with
// loader.ErrMissingObject (class BadCheckpoint); a Transactional one
// without touching the targets.
func caseMissingObject(t T, h *Harness) {
	ctx := context.Background()
	root := h.NewStore(t)
	f := newFixture(14)
	for _, damage := range []struct {
		name, rule string
		do         func(st *backend.Store, key string)
		want       error
	}{
		{"deleted", loader.RuleMissingObject, func(st *backend.Store, key string) {
			require.NoError(t, st.Delete(ctx, key))
		}, loader.ErrMissingObject},
		{"truncated", loader.RuleObjectSize, func(st *backend.Store, key string) {
			data, err := st.ReadAll(ctx, key, 0)
			require.NoError(t, err)
			require.NoError(t, st.PutBytes(ctx, key, data[:len(data)-1], backend.PutOptions{}))
		}, loader.ErrMissingObject},
	} {
		st, err := root.Sub(damage.name)
		require.NoError(t, err)
		res := save(t, st, f, 2, saver.Options{})
		obj := res.Metadata.Objects[len(res.Metadata.Objects)-1].Key
		damage.do(st, obj)

		vr, err := loader.Verify(ctx, st, loader.VerifyOptions{})
		require.NoError(t, err)
		require.False(t, vr.Resumable, "%s data object", damage.name)
		require.NotEmpty(t, vr.Problems)
		require.Equal(t, damage.rule, vr.Problems[0].Rule, "%+v", vr.Problems)
		require.Contains(t, vr.Problems[0].Object, obj)

		_, err = loader.Load(ctx, st, f.targets(2), quietLoad())
		require.ErrorIs(t, err, damage.want, "a load from a checkpoint with a %s data object", damage.name)
		require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err), "a %s data object makes a bad checkpoint: %v", damage.name, err)

		targets := f.targets(2)
		before := snapshot(targets)
		opts := quietLoad()
		opts.Transactional = true
		_, err = loader.Load(ctx, st, targets, opts)
		require.ErrorIs(t, err, damage.want, "a transactional load from a checkpoint with a %s data object", damage.name)
		require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err), "a %s data object makes a bad checkpoint: %v", damage.name, err)
		requireUnchanged(t, before, targets)
	}
}

// caseWeightsOnly: resume rule 6 for a checkpoint saved without any
// optimizer key (record "none", not "omitted"): a target asking for
// optimizer state fails with ErrMissingKeys instead of starting fresh
// silently; with NoLoadOptimizer it loads iteration, scheduler and model.
func caseWeightsOnly(t T, h *Harness) {
	st := h.NewStore(t)
	f := newFixture(15)
	state := f.saveState(2)
	for _, sd := range state {
		for _, k := range sd.Keys() {
			if isOptimizerKey(k) {
				delete(sd.Tensors, k)
				delete(sd.Bytes, k)
			}
		}
	}
	res, err := saver.SaveLocal(context.Background(), st, state, saver.Options{Iteration: 21})
	require.NoError(t, err)
	require.Equal(t, metadata.OptimizerNone, res.Metadata.Training.Optimizer)

	expectRejected(t, st, f, quietLoad(), loader.ErrMissingKeys, "optimizer.state.")
	opts := quietLoad()
	opts.NoLoadOptimizer = true
	loadWithoutOptimizer(t, st, f, 2, 21, opts)
}

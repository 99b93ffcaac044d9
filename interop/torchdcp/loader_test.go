package torchdcp_test

// Loader-level tests on the real torch 1.13 fixtures: everything goes
// through the public API (backend.Open on the testdata directory,
// loader.Open / Load / Verify, Checkpoint.ReadTensor and ReadBytes) and is
// checked against the fixtures' expected.json.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/interop/torchdcp"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// loaderCases are every fixture case, with the iteration ("step") each holds.
var loaderCases = map[string]int64{
	"dense":              1,
	"sparse_optim":       1,
	"frozen":             1,
	"nested_unflattened": 1,
	"partial_optim":      1,
	"sharded_2rank":      7,
}

type ldChunk struct {
	Offsets []int64 `json:"offsets"`
	Sizes   []int64 `json:"sizes"`
	File    string  `json:"file"`
}

type ldKey struct {
	Key    string          `json:"key"`
	Kind   string          `json:"kind"`
	DType  string          `json:"dtype"`
	Shape  []int64         `json:"shape"`
	SHA256 string          `json:"sha256"`
	Chunks []ldChunk       `json:"chunks"`
	Value  json.RawMessage `json:"value"`
}

type ldExpected struct {
	Keys       []ldKey  `json:"keys"`
	AbsentKeys []string `json:"absent_keys"`
}

func (e *ldExpected) tensors() []ldKey {
	var out []ldKey
	for _, k := range e.Keys {
		if k.Kind == "tensor" {
			out = append(out, k)
		}
	}
	return out
}

func (e *ldExpected) key(name string) ldKey {
	for _, k := range e.Keys {
		if k.Key == name {
			return k
		}
	}
	return ldKey{}
}

func readExpected(t *testing.T, name string) *ldExpected {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name, "expected.json"))
	require.NoError(t, err)
	var e ldExpected
	require.NoError(t, json.Unmarshal(raw, &e))
	require.NotEmpty(t, e.Keys, name)
	return &e
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openStore(t *testing.T, dir string) *backend.Store {
	t.Helper()
	abs, err := filepath.Abs(dir)
	require.NoError(t, err)
	st, err := backend.Open(context.Background(), abs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func openCase(t *testing.T, name string) (*backend.Store, *loader.Checkpoint) {
	t.Helper()
	st := openStore(t, filepath.Join("testdata", name))
	c, err := loader.Open(context.Background(), st)
	require.NoError(t, err)
	require.Equal(t, torchdcp.FormatName, c.FormatName())
	return st, c
}

// copyCase copies a fixture directory (dot files included) to a temp dir.
func copyCase(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	src := filepath.Join("testdata", name)
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		if e.Name() == "expected.json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
	return dst
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// dims normalises a JSON shape ([] or null) and a Go shape for comparison.
func dims(s []int64) []int64 { return append([]int64{}, s...) }

// unTupleJSON rewrites expected.json's {"__tuple__": [...]} as arrays, as the
// bytes decoder emits tuples.
func unTupleJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if inner, ok := x["__tuple__"]; ok && len(x) == 1 {
			return unTupleJSON(inner)
		}
		for k, y := range x {
			x[k] = unTupleJSON(y)
		}
	case []any:
		for i, y := range x {
			x[i] = unTupleJSON(y)
		}
	}
	return v
}

// checkBytesValue checks a bytes value as the loader returns it against
// expected.json: JSON for plain values, the raw item for opaque ones.
func checkBytesValue(t *testing.T, k ldKey, got []byte) {
	t.Helper()
	require.NotEmpty(t, got, k.Key)
	if bytes.Contains(k.Value, []byte(`"__tensor__"`)) {
		assert.True(t, torchdcp.IsRawItem(got), "%s: a dict hiding tensors comes back as the raw item", k.Key)
		return
	}
	require.False(t, torchdcp.IsRawItem(got), k.Key)
	var want, have any
	require.NoError(t, json.Unmarshal(k.Value, &want))
	require.NoError(t, json.Unmarshal(got, &have), "%s: %s", k.Key, got)
	assert.Equal(t, unTupleJSON(want), have, k.Key)
}

// fullTarget is a load target asking for every key of the checkpoint:
// whole tensors of the saved dtype and shape, every bytes key.
func fullTarget(c *loader.Checkpoint) *statedict.StateDict {
	md := c.Metadata()
	sd := statedict.New()
	for _, te := range md.Tensors {
		sd.Tensors[te.Key] = statedict.Whole(statedict.NewTensor(statedict.DType(te.DType), te.Shape...))
	}
	for _, be := range md.Bytes {
		sd.Bytes[be.Key] = nil
	}
	return sd
}

// fill sets every target buffer to a sentinel and every bytes value to a
// marker, so untouched keys can be told from loaded ones.
func fill(sd *statedict.StateDict, b byte) {
	for _, s := range sd.Tensors {
		for i := range s.Data {
			s.Data[i] = b
		}
	}
	for k := range sd.Bytes {
		sd.Bytes[k] = []byte("untouched")
	}
}

func snapshot(sd *statedict.StateDict) *statedict.StateDict {
	out := statedict.New()
	for k, s := range sd.Tensors {
		c := *s
		c.Data = slices.Clone(s.Data)
		out.Tensors[k] = &c
	}
	for k, v := range sd.Bytes {
		out.Bytes[k] = slices.Clone(v)
	}
	return out
}

func TestLoaderReadTensorAllFixtures(t *testing.T) {
	ctx := context.Background()
	for name := range loaderCases {
		t.Run(name, func(t *testing.T) {
			exp := readExpected(t, name)
			_, c := openCase(t, name)
			md := c.Metadata()
			assert.Equal(t, len(exp.Keys), len(md.Tensors)+len(md.Bytes))
			for _, k := range exp.Keys {
				switch k.Kind {
				case "tensor":
					tn, err := c.ReadTensor(ctx, k.Key)
					require.NoError(t, err, k.Key)
					assert.Equal(t, k.DType, string(tn.DType), k.Key)
					assert.Equal(t, dims(k.Shape), dims(tn.Shape), k.Key)
					assert.Equal(t, k.SHA256, hexSHA(tn.Data), "sha256 of %s", k.Key)
				case "bytes":
					b, err := c.ReadBytes(ctx, k.Key)
					require.NoError(t, err, k.Key)
					checkBytesValue(t, k, b)
				default:
					t.Fatalf("%s: unknown kind %q", k.Key, k.Kind)
				}
			}
			for _, k := range exp.AbsentKeys {
				_, err := c.ReadTensor(ctx, k)
				assert.ErrorIs(t, err, planner.ErrKeyNotFound, k)
			}
		})
	}
}

func TestLoaderLoadFullTarget(t *testing.T) {
	ctx := context.Background()
	for name, iter := range loaderCases {
		if name == "partial_optim" {
			continue // refused: TestLoaderPartialOptimizerState
		}
		t.Run(name, func(t *testing.T) {
			exp := readExpected(t, name)
			st, c := openCase(t, name)
			target := fullTarget(c)
			fill(target, 0xA5)
			rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
			require.NoError(t, err)
			assert.Equal(t, torchdcp.FormatName, rep.Format)
			assert.Equal(t, iter, rep.Iteration)
			assert.Equal(t, len(exp.Keys), rep.KeysLoaded)
			assert.Empty(t, rep.LazyParams)
			assert.Empty(t, rep.ExtraKeys)
			assert.Empty(t, rep.FrozenMissing)
			for _, k := range exp.Keys {
				if k.Kind == "tensor" {
					sh := target.Tensors[k.Key]
					require.NotNil(t, sh, k.Key)
					assert.Equal(t, k.SHA256, hexSHA(sh.Data), "sha256 of loaded %s", k.Key)
					continue
				}
				got, ok := target.Bytes[k.Key]
				require.True(t, ok, k.Key)
				require.NotEqual(t, "untouched", string(got), k.Key)
				checkBytesValue(t, k, got)
			}
		})
	}
}

func TestLoaderSparseOptimLazyHead(t *testing.T) {
	ctx := context.Background()
	st, c := openCase(t, "sparse_optim")
	exp := readExpected(t, "sparse_optim")

	// A resuming job builds optimizer state for every trainable parameter,
	// including the head that never got a gradient.
	target := fullTarget(c)
	lazy := map[string]*statedict.Shard{
		"optimizer.state.unused_head.weight.exp_avg":    statedict.Whole(statedict.NewTensor(statedict.Float32, 3, 16)),
		"optimizer.state.unused_head.weight.exp_avg_sq": statedict.Whole(statedict.NewTensor(statedict.Float32, 3, 16)),
		"optimizer.state.unused_head.weight.step":       statedict.Whole(statedict.NewTensor(statedict.Float32)),
	}
	for k, s := range lazy {
		require.Contains(t, exp.AbsentKeys, k)
		target.Tensors[k] = s
	}
	fill(target, 0x5A)

	rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.NoError(t, err)
	assert.Equal(t, []string{"unused_head.weight"}, rep.LazyParams)
	assert.Equal(t, 3, rep.LazyKeys)
	assert.True(t, rep.OptimizerLoaded)
	assert.Equal(t, len(exp.Keys), rep.KeysLoaded)
	assert.Contains(t, rep.Summary(), "unused_head.weight")
	for k, s := range lazy {
		assert.Equal(t, bytes.Repeat([]byte{0x5A}, len(s.Data)), s.Data, "%s must stay untouched (fresh)", k)
	}
	for _, k := range exp.tensors() {
		assert.Equal(t, k.SHA256, hexSHA(target.Tensors[k.Key].Data), k.Key)
	}

	for _, deep := range []bool{false, true} {
		vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: deep})
		require.NoError(t, err)
		assert.True(t, vr.Resumable, "deep=%v: %+v", deep, vr.Problems)
		assert.Empty(t, vr.Problems)
		assert.Equal(t, int64(1), vr.Iteration)
		require.Len(t, vr.Info, 1)
		assert.Equal(t, loader.RuleLazyOptimizer, vr.Info[0].Rule)
		assert.Contains(t, vr.Info[0].Message, "unused_head.weight")
		if deep {
			assert.Positive(t, vr.BytesChecked)
		}
	}
}

func TestLoaderFrozenBias(t *testing.T) {
	ctx := context.Background()
	st, c := openCase(t, "frozen")
	exp := readExpected(t, "frozen")
	require.NotNil(t, c.Metadata().Tensor("model.fc1.bias"), "the frozen parameter itself is saved")

	// The optimizer was built from the trainable parameters only: fc1.bias
	// is not in optimizer.param_groups.0.params, so it is no lazily absent
	// parameter of this checkpoint.
	assert.NotContains(t, c.Metadata().Training.Params, "fc1.bias")
	assert.Contains(t, c.Metadata().Training.Params, "fc1.weight")
	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	assert.True(t, vr.Resumable, "%+v", vr.Problems)
	assert.Empty(t, vr.Problems)
	assert.Empty(t, vr.Info, "no parameter of the optimizer lacks state")

	// A job that unfroze it asks for its state and gets it left fresh.
	target := fullTarget(c)
	for _, slot := range []string{"exp_avg", "exp_avg_sq"} {
		target.Tensors["optimizer.state.fc1.bias."+slot] = statedict.Whole(statedict.NewTensor(statedict.Float32, 16))
	}
	target.Tensors["optimizer.state.fc1.bias.step"] = statedict.Whole(statedict.NewTensor(statedict.Float32))
	fill(target, 0x11)
	rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.NoError(t, err)
	assert.Equal(t, []string{"fc1.bias"}, rep.LazyParams)
	assert.Equal(t, 3, rep.LazyKeys)
	assert.Equal(t, bytes.Repeat([]byte{0x11}, 64), target.Tensors["optimizer.state.fc1.bias.exp_avg"].Data)
	assert.Equal(t, exp.key("model.fc1.bias").SHA256, hexSHA(target.Tensors["model.fc1.bias"].Data))
}

func TestLoaderPartialOptimizerState(t *testing.T) {
	ctx := context.Background()
	st, c := openCase(t, "partial_optim")
	exp := readExpected(t, "partial_optim")
	const missing = "optimizer.state.fc2.bias.exp_avg_sq"
	require.Contains(t, exp.AbsentKeys, missing)
	require.Nil(t, c.Metadata().Tensor(missing))
	require.NotNil(t, c.Metadata().Tensor("optimizer.state.fc2.bias.exp_avg"))

	// The resuming job's full target: every saved key plus every AdamW slot
	// of every parameter (fc2.bias's exp_avg_sq, unused_head's three).
	target := fullTarget(c)
	target.Tensors[missing] = statedict.Whole(statedict.NewTensor(statedict.Float32, 4))
	for _, slot := range []string{"exp_avg", "exp_avg_sq"} {
		target.Tensors["optimizer.state.unused_head.weight."+slot] = statedict.Whole(statedict.NewTensor(statedict.Float32, 3, 16))
	}
	target.Tensors["optimizer.state.unused_head.weight.step"] = statedict.Whole(statedict.NewTensor(statedict.Float32))
	fill(target, 0x77)
	before := snapshot(target)

	rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrPartialOptimizerState)
	assert.Nil(t, rep)
	assert.Contains(t, err.Error(), `"fc2.bias"`)
	assert.Contains(t, err.Error(), missing)
	assert.Contains(t, err.Error(), "optimizer.state.fc2.bias.exp_avg,")
	assert.NotContains(t, err.Error(), "unused_head", "a wholly absent state is lazy, not partial")
	assert.Equal(t, before, target, "a refused load leaves the target unchanged")

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{})
	require.NoError(t, err)
	assert.False(t, vr.Resumable)
	require.Len(t, vr.Problems, 1, "%+v", vr.Problems)
	p := vr.Problems[0]
	assert.Equal(t, loader.RulePartialOptimizer, p.Rule)
	assert.Equal(t, "optimizer.state.fc2.bias", p.Key)
	assert.Contains(t, p.Message, missing)
	// unused_head stays information, not a problem.
	require.Len(t, vr.Info, 1)
	assert.Equal(t, loader.RuleLazyOptimizer, vr.Info[0].Rule)
	assert.Contains(t, vr.Info[0].Message, "unused_head.weight")
}

func TestLoaderSharded2Rank(t *testing.T) {
	ctx := context.Background()
	st, c := openCase(t, "sharded_2rank")
	exp := readExpected(t, "sharded_2rank")
	md := c.Metadata()
	assert.Equal(t, 2, md.WorldSize)

	for _, key := range []string{"model.emb.weight", "model.proj.weight"} {
		te := md.Tensor(key)
		require.NotNil(t, te, key)
		require.Len(t, te.Chunks, 2, key)
		assert.ElementsMatch(t, []string{"__0_0.distcp", "__1_0.distcp"}, []string{te.Chunks[0].Object, te.Chunks[1].Object}, key)
		tn, err := c.ReadTensor(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, exp.key(key).SHA256, hexSHA(tn.Data), "reassembled %s", key)
	}

	// Reshard on load: two ranks, emb split 2+3 rows (saved as 3+2), proj
	// split by rows (saved by columns). Expected bytes come from the whole
	// tensors, which ReadTensor returned bit-exactly above.
	whole := map[string]*statedict.Tensor{}
	for _, k := range exp.tensors() {
		tn, err := c.ReadTensor(ctx, k.Key)
		require.NoError(t, err)
		whole[k.Key] = tn
	}
	targets := make([]*statedict.StateDict, 2)
	for r := range targets {
		sd := statedict.New()
		for k, tn := range whole {
			z := statedict.NewTensor(tn.DType, tn.Shape...)
			if strings.HasSuffix(k, ".weight") && len(tn.Shape) == 2 {
				sd.Tensors[k] = statedict.RowShard(z, 1-r, 2) // rank 0 gets the smaller half
			} else {
				sd.Tensors[k] = statedict.Whole(z)
			}
		}
		sd.Bytes["step"] = nil
		targets[r] = sd
	}
	rep, err := loader.Load(ctx, st, targets, loader.Options{Logger: quiet()})
	require.NoError(t, err)
	assert.Equal(t, int64(7), rep.Iteration)
	for r, sd := range targets {
		for k, sh := range sd.Tensors {
			want := statedict.Whole(whole[k])
			if strings.HasSuffix(k, ".weight") && len(whole[k].Shape) == 2 {
				want = statedict.RowShard(whole[k], 1-r, 2)
			}
			assert.Equal(t, want.Offsets, sh.Offsets, "rank %d %s", r, k)
			assert.Equal(t, want.Data, sh.Data, "rank %d %s", r, k)
		}
		assert.Equal(t, "7", string(sd.Bytes["step"]), "rank %d", r)
	}

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	assert.True(t, vr.Resumable, "%+v", vr.Problems)
}

func TestLoaderSharded2RankMissingRankFile(t *testing.T) {
	ctx := context.Background()
	dir := copyCase(t, "sharded_2rank")
	require.NoError(t, os.Remove(filepath.Join(dir, "__1_0.distcp")))
	st := openStore(t, dir)

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	assert.False(t, vr.Resumable)
	require.Len(t, vr.Problems, 1, "%+v", vr.Problems)
	assert.Equal(t, loader.RuleMissingObject, vr.Problems[0].Rule)
	assert.Contains(t, vr.Problems[0].Object, "__1_0.distcp")

	c, err := loader.Open(ctx, st)
	require.NoError(t, err, "the metadata is intact")
	_, err = c.ReadTensor(ctx, "model.emb.weight")
	require.ErrorIs(t, err, backend.ErrNotFound)
	// The default one-pass load fails on the missing object; a
	// Transactional one also leaves the target as it was.
	_, err = c.Load(ctx, []*statedict.StateDict{fullTarget(c)}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, backend.ErrNotFound)
	require.ErrorIs(t, err, loader.ErrMissingObject)
	target := fullTarget(c)
	fill(target, 0x33)
	before := snapshot(target)
	_, err = c.Load(ctx, []*statedict.StateDict{target}, loader.Options{Transactional: true, Logger: quiet()})
	require.ErrorIs(t, err, backend.ErrNotFound)
	assert.Equal(t, before, target, "a failed transactional load leaves the target unchanged")
}

func TestLoaderSharded2RankMissingChunk(t *testing.T) {
	ctx := context.Background()
	dir := copyCase(t, "sharded_2rank")
	// The same metadata, re-pickled by torch without rank 1's chunk of
	// model.emb.weight (rows 3-4); see testdata/gen.
	variant, err := os.ReadFile(filepath.Join("testdata", "variants", "sharded_2rank-drop-chunk.metadata"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".metadata"), variant, 0o644))
	st := openStore(t, dir)

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	assert.False(t, vr.Resumable)
	require.Len(t, vr.Problems, 1, "%+v", vr.Problems)
	p := vr.Problems[0]
	assert.Equal(t, loader.RuleShardCoverage, p.Rule)
	assert.Equal(t, "model.emb.weight", p.Key)
	assert.Contains(t, p.Message, "gap at offsets [3 0] sizes [2 4]")

	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	_, err = c.ReadTensor(ctx, "model.emb.weight")
	require.ErrorIs(t, err, planner.ErrCoverage)
	var ce *planner.CoverageError
	require.ErrorAs(t, err, &ce)
	target := fullTarget(c)
	fill(target, 0x44)
	before := snapshot(target)
	_, err = c.Load(ctx, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, planner.ErrCoverage)
	assert.Equal(t, before, target)
}

// Regression: a target built from the metadata (asking only for keys the
// checkpoint has) used to load partial_optim although Verify refused it;
// partial optimizer state anywhere in the checkpoint is refused.
func TestLoaderPartialOptimizerStateWithMetadataTarget(t *testing.T) {
	_, c := openCase(t, "partial_optim")
	target := fullTarget(c)
	before := snapshot(target)
	_, err := c.Load(context.Background(), []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrPartialOptimizerState)
	require.Contains(t, err.Error(), "optimizer.state.fc2.bias.exp_avg_sq")
	require.Equal(t, before, target, "a refused load must leave the target untouched")
}

package torchdcp

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	mod2x   = "torch.distributed.checkpoint.metadata"
	fs2x    = "torch.distributed.checkpoint.filesystem"
	strided = "torch.strided"
)

// obj emits NEWOBJ of a class with no arguments.
func (p *pk) obj(module, class string) *pk {
	return p.sglobal(module, class).op(opEmptyTuple, opNewObj)
}

// storageInfo2x emits a 2.x _StorageInfo with its BUILD.
func (p *pk) storageInfo2x(path string, off, n int64, transforms []string) *pk {
	p.obj(fs2x, "_StorageInfo").op(opEmptyDict, opMark)
	p.str("relative_path").str(path).str("offset").int(off).str("length").int(n)
	p.str("transform_descriptors")
	if transforms == nil {
		p.op(opNone)
	} else {
		p.op(opEmptyList, opMark)
		for _, s := range transforms {
			p.str(s)
		}
		p.op(opAppends)
	}
	return p.op(opSetItems, opBuild)
}

// index2x emits a MetadataIndex; offset nil means a bytes item.
func (p *pk) index2x(fqn string, offset []int64, index int64) *pk {
	p.obj(mod2x, "MetadataIndex").op(opEmptyDict, opMark).str("fqn").str(fqn)
	if offset != nil {
		p.str("offset").size(offset...).str("index").int(index)
	} else {
		p.str("index").op(opNone)
	}
	return p.op(opSetItems, opBuild)
}

// tensorMeta2x emits a TensorStorageMetadata with 2.x TensorProperties.
func (p *pk) tensorMeta2x(dtype string, size []int64, chunks [][2][]int64) *pk {
	p.obj(mod2x, "TensorStorageMetadata").op(opEmptyDict, opMark)
	p.str("properties").obj(mod2x, "TensorProperties").op(opMark)
	p.sglobal("torch", dtype)
	p.sglobal("torch.serialization", "_get_layout").str(strided).op(opTuple1, opReduce)
	p.op(opNewFalse)
	p.sglobal("builtins", "getattr").sglobal(mod2x, "_MEM_FORMAT_ENCODING").str("TORCH_CONTIGUOUS_FORMAT").op(opTuple2, opReduce)
	p.op(opNewFalse, opTuple, opBuild)
	p.str("size").size(size...)
	p.str("chunks").op(opEmptyList)
	for _, ch := range chunks {
		p.obj(mod2x, "ChunkStorageMetadata").op(opEmptyDict, opMark)
		p.str("offsets").size(ch[0]...).str("sizes").size(ch[1]...)
		p.op(opSetItems, opBuild, opAppend)
	}
	return p.op(opSetItems, opBuild)
}

// metadata2x hand-assembles a torch 2.x .metadata pickle (protocol 4): a
// bfloat16 tensor sharded in two chunks over two rank files, a 0-dim
// optimizer step tensor, a bytes item, and the newer optional fields.
func metadata2x(transforms []string) []byte {
	p := newPickle(4)
	p.b = append(p.b, opFrame, 0, 0, 0, 0, 0, 0, 0, 0) // a zero-length frame is legal
	p.str(mod2x).op(opMemoize)                         // memo 0: module name
	p.op(opBinGet, 0).str("Metadata").op(opStackGlobal, opEmptyTuple, opNewObj)
	p.op(opEmptyDict, opMark)
	p.str("state_dict_metadata").op(opEmptyDict, opMark)
	p.str("model.w").tensorMeta2x("bfloat16", []int64{4, 6}, [][2][]int64{{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}})
	p.str("optimizer.state.w.step").tensorMeta2x("float32", nil, [][2][]int64{{nil, nil}})
	p.str("step").obj(mod2x, "BytesStorageMetadata")
	p.op(opSetItems)
	p.str("planner_data").op(opNone)
	p.str("storage_data").op(opEmptyDict, opMark)
	p.index2x("model.w", []int64{2, 0}, 1).storageInfo2x("__1_0.distcp", 0, 100, transforms)
	p.index2x("model.w", []int64{0, 0}, 0).storageInfo2x("__0_0.distcp", 50, 100, nil)
	p.index2x("optimizer.state.w.step", []int64{}, 0).storageInfo2x("__0_0.distcp", 150, 40, nil)
	p.index2x("step", nil, 0).storageInfo2x("__0_0.distcp", 0, 50, nil)
	p.op(opSetItems)
	p.str("storage_meta").obj(mod2x, "StorageMeta").op(opEmptyDict, opMark)
	p.str("checkpoint_id").sglobal("pathlib", "PosixPath").str("/ckpt").str("run7").op(opTuple2, opReduce)
	p.str("save_id").str("abc").str("load_id").op(opNone).str("modules").op(opEmptyList)
	p.op(opSetItems, opBuild)
	p.str("version").str("1.0.0")
	p.op(opSetItems, opBuild)
	return p.stop()
}

func TestDecodeMetadataTorch2x(t *testing.T) {
	c, err := DecodeMetadata(metadata2x(nil))
	require.NoError(t, err)
	assert.Equal(t, FormatName, c.Format)
	assert.Equal(t, VersionTorch2, c.Version)
	assert.Contains(t, c.Writer, "torch.distributed.checkpoint")
	assert.Contains(t, c.Writer, "metadata version 1.0.0")
	assert.Equal(t, 2, c.WorldSize)

	w := c.Tensor("model.w")
	require.NotNil(t, w)
	assert.Equal(t, "bfloat16", w.DType)
	assert.Equal(t, []int64{4, 6}, w.Shape)
	require.Len(t, w.Chunks, 2)
	assert.Equal(t, metadata.Chunk{Offsets: []int64{0, 0}, Sizes: []int64{2, 6}, Object: "__0_0.distcp", Offset: 50, Length: 100, Encoding: EncodingTensor}, w.Chunks[0])
	assert.Equal(t, metadata.Chunk{Offsets: []int64{2, 0}, Sizes: []int64{2, 6}, Object: "__1_0.distcp", Offset: 0, Length: 100, Encoding: EncodingTensor}, w.Chunks[1])

	s := c.Tensor("optimizer.state.w.step")
	require.NotNil(t, s)
	assert.Empty(t, s.Shape)
	require.Len(t, s.Chunks, 1)
	assert.Equal(t, int64(150), s.Chunks[0].Offset)

	b := c.BytesValue("step")
	require.NotNil(t, b)
	assert.Equal(t, metadata.BytesEntry{Key: "step", Object: "__0_0.distcp", Offset: 0, Length: 50, Encoding: EncodingBytes}, *b)

	assert.Equal(t, []metadata.ObjectEntry{{Key: "__0_0.distcp", Size: 190}, {Key: "__1_0.distcp", Size: 100}}, c.Objects)
	assert.Equal(t, metadata.OptimizerSaved, c.Training.Optimizer)
	assert.Equal(t, []string{"step"}, c.Training.OptimizerSlots)
	assert.Equal(t, 1, c.Training.OptimizerStateEntries)
	assert.Empty(t, c.Training.SchedulerPrefix)
}

func TestDecodeMetadataRefusesTransforms(t *testing.T) {
	_, err := DecodeMetadata(metadata2x([]string{"stream_zstd"}))
	require.ErrorIs(t, err, ErrUnsupportedTransform)
	assert.Contains(t, err.Error(), "stream_zstd")
	assert.Contains(t, err.Error(), "model.w")
	// An empty descriptor list is no transform.
	_, err = DecodeMetadata(metadata2x([]string{}))
	require.NoError(t, err)
}

func TestForbiddenGlobals(t *testing.T) {
	cases := map[string][]byte{
		"os.system STACK_GLOBAL":  newPickle(4).sglobal("os", "system").str("echo pwned").op(opTuple1, opReduce).stop(),
		"posix.system GLOBAL":     newPickle(2).global("posix", "system").str("id").op(opTuple1, opReduce).stop(),
		"builtins.eval":           newPickle(2).global("builtins", "eval").stop(),
		"DCP-like name elsewhere": newPickle(4).sglobal("evil.torch.distributed.checkpoint.metadata", "Metadata").stop(),
		"unknown DCP class":       newPickle(4).sglobal(mod2x, "SomethingElse").stop(),
		"torch function":          newPickle(4).sglobal("torch", "load").stop(),
	}
	for name, pkl := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeMetadata(pkl)
			require.ErrorIs(t, err, ErrForbiddenGlobal)
			var fg *ForbiddenGlobalError
			require.True(t, errors.As(err, &fg))
			assert.Contains(t, err.Error(), fg.Module+"."+fg.Name)
		})
	}
	_, err := DecodeMetadata(cases["os.system STACK_GLOBAL"])
	assert.Contains(t, err.Error(), "os.system")

	// getattr is only allowed on the memory-format enum.
	pkl := newPickle(4).sglobal("builtins", "getattr").sglobal("collections", "OrderedDict").str("fromkeys").op(opTuple2, opReduce).stop()
	_, err = unpickle(pkl, nil)
	require.ErrorIs(t, err, ErrForbiddenGlobal)

	// A forbidden global inside a tensor item or a bytes item.
	item := torchSave(t, "archive", cases["posix.system GLOBAL"], nil, nil)
	_, _, _, err = DecodeTensor(item)
	require.ErrorIs(t, err, ErrForbiddenGlobal)
	assert.Contains(t, err.Error(), "posix.system")
	_, err = DecodeValue(item)
	require.ErrorIs(t, err, ErrForbiddenGlobal)
	require.NotErrorIs(t, err, ErrOpaque, "a hostile value is reported, not skipped as opaque")
	_, err = decodeBytesItem(item, "", nil)
	require.ErrorIs(t, err, ErrForbiddenGlobal, "a bytes item naming an unknown global is refused, never handed over raw")
	assert.Contains(t, err.Error(), "posix.system")
}

func TestUnpickleScalars(t *testing.T) {
	p := newPickle(2).op(opMark)
	p.int(7).int(-2).int(70000).int(-1<<40).float(0.5).op(opNone, opNewTrue, opNewFalse)
	p.b = append(p.b, opShortBinBytes, 2, 'h', 'i')
	p.b = append(p.b, opLong1, 0) // zero-length LONG1 is 0
	p.b = append(p.b, opLong1, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0)
	p.b = append(p.b, opLong1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	p.op(opTuple)
	v, err := unpickle(p.stop(), nil)
	require.NoError(t, err)
	assert.Equal(t, pyTuple{int64(7), int64(-2), int64(70000), int64(-1 << 40), 0.5, nil, true, false, []byte("hi"), int64(0), int64(1), int64(-1)}, v)

	_, err = unpickle(append(newPickle(2).b, opLong1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1, opStop), nil)
	require.ErrorIs(t, err, ErrMalformed, "2**64 does not fit")
}

func TestUnpickleMemoAndContainers(t *testing.T) {
	// [("a", 1), ("a", 1)] built through BINPUT/BINGET, a dict via DICT, DUP and POP.
	p := newPickle(2).op(opEmptyList, opMark)
	p.str("a").int(1).op(opTuple2, opBinPut, 0, opBinGet, 0)
	p.op(opAppends)
	p.op(opMark).str("k").int(2).op(opDict, opDup, opPop, opAppend)
	v, err := unpickle(p.stop(), nil)
	require.NoError(t, err)
	budget := 1000
	got, err := plain(v, 0, &budget)
	require.NoError(t, err)
	assert.Equal(t, []any{[]any{"a", int64(1)}, []any{"a", int64(1)}, map[string]any{"k": int64(2)}}, got)
}

func TestUnpickleMalformed(t *testing.T) {
	cases := map[string][]byte{
		"empty":             {},
		"no stop":           newPickle(2).int(1).b,
		"protocol 1":        {opProto, 1, opNone, opStop},
		"unknown opcode":    {opProto, 2, 0xff, opStop},
		"INST refused":      {opProto, 2, 'i', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', opStop},
		"underflow":         {opProto, 2, opTuple1, opStop},
		"no mark":           {opProto, 2, opTuple, opStop},
		"undefined memo":    {opProto, 2, opBinGet, 9, opStop},
		"string too long":   {opProto, 2, opBinUnicode, 0xff, 0xff, 0xff, 0x7f, 'a', opStop},
		"frame too long":    {opProto, 4, opFrame, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, opStop},
		"append to int":     newPickle(2).int(1).int(2).op(opAppend).stop(),
		"unhashable key":    newPickle(2).op(opEmptyDict, opEmptyList, opNone, opSetItem).stop(),
		"persid forbidden":  newPickle(2).str("x").op(opBinPersID).stop(),
		"reduce non-tuple":  newPickle(2).global("torch", "Size").int(1).op(opReduce).stop(),
		"global no newline": []byte("\x80\x02ctorch"),
	}
	for name, pkl := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := unpickle(pkl, nil)
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

func TestPlainLimits(t *testing.T) {
	// A list that contains itself: cyclic, refused rather than looping.
	p := newPickle(2).op(opEmptyList, opBinPut, 0, opBinGet, 0, opAppend)
	v, err := unpickle(p.stop(), nil)
	require.NoError(t, err)
	budget := 1 << 20
	_, err = plain(v, 0, &budget)
	require.ErrorIs(t, err, ErrMalformed)

	// Doubling sharing (l = [l, l] 40 times) is stopped by the budget.
	p = newPickle(2).op(opEmptyList)
	for i := 0; i < 40; i++ {
		p.op(opBinPut, 0, opEmptyList, opBinGet, 0, opBinGet, 0, opTuple2, opAppend)
	}
	pkl := p.stop()
	v, err = unpickle(pkl, nil)
	require.NoError(t, err)
	budget = 4*len(pkl) + 64
	_, err = plain(v, 0, &budget)
	require.ErrorIs(t, err, ErrMalformed)
}

func TestDecodeLong(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want int64
	}{
		{[]byte{0xff}, -1},
		{[]byte{0x80}, -128},
		{[]byte{0x80, 0x00}, 128},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, math.MaxInt64},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80}, math.MinInt64},
	} {
		got, err := decodeLong(c.in)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%x", c.in)
	}
	_, err := decodeLong([]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0})
	require.ErrorIs(t, err, ErrMalformed, "2**63 needs 9 bytes")
}

func TestAmplificationLimits(t *testing.T) {
	// OrderedDict(big memoised list) called again and again.
	p := newPickle(2).op(opEmptyList, opMark)
	for i := 0; i < 500; i++ {
		p.int(int64(i)).int(0).op(opTuple2)
	}
	p.op(opAppends, opBinPut, 0)
	p.global("collections", "OrderedDict").op(opBinPut, 1, opPop)
	for i := 0; i < 2000; i++ {
		p.op(opBinGet, 1, opBinGet, 0, opTuple1, opReduce, opPop)
	}
	_, err := unpickle(p.stop(), nil)
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "copies more data")

	// One 1000-chunk tensor metadata object shared by 1000 keys.
	p = newPickle(4)
	p.obj(mod2x, "Metadata").op(opEmptyDict, opMark).str("state_dict_metadata").op(opEmptyDict, opMark)
	chunks := make([][2][]int64, 1000)
	for i := range chunks {
		chunks[i] = [2][]int64{{0}, {1}} // all alike: one storage entry serves them
	}
	key := func(i int) string { return "k" + strconv.Itoa(i) }
	p.str(key(0)).tensorMeta2x("float32", []int64{1000}, chunks).op(opLongBinPut, 0, 0, 0, 0)
	for i := 1; i < 1000; i++ {
		p.str(key(i)).op(opLongBinGet, 0, 0, 0, 0)
	}
	p.op(opSetItems).str("storage_data").op(opEmptyDict, opMark)
	for i := 0; i < 1000; i++ {
		p.index2x(key(i), []int64{0}, 0).storageInfo2x("__0_0.distcp", 0, 1, nil)
	}
	p.op(opSetItems, opSetItems, opBuild)
	_, err = DecodeMetadata(p.stop())
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "more chunks than its size allows")
}

// Regression (issue 16): a DCP "step" item whose pickle names a forbidden
// global was taken for an opaque value, so the checkpoint reported
// "iteration 0" and resumable. FillIteration reports the global.
func TestFillIterationReportsAForbiddenGlobal(t *testing.T) {
	item := torchSave(t, "archive", newPickle(2).global("posix", "system").str("id").op(opTuple1, opReduce).stop(), nil, nil)
	c := &metadata.Checkpoint{Bytes: []metadata.BytesEntry{{Key: "step", Object: "__0_0.distcp", Length: int64(len(item)), Encoding: EncodingBytes}}}
	read := func(string, int64, int64) ([]byte, error) { return item, nil }
	found, err := FillIteration(c, read)
	require.ErrorIs(t, err, ErrForbiddenGlobal)
	assert.Contains(t, err.Error(), "posix.system")
	assert.Contains(t, err.Error(), `"step"`)
	assert.False(t, found)
	assert.Zero(t, c.Training.Iteration)
}

package torchdcp

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bytesCheckpointState emits the field dict of a 2.x Metadata holding one
// bytes item key stored in object.
func (p *pk) bytesCheckpointState(key, object string) *pk {
	p.op(opEmptyDict, opMark)
	p.str("state_dict_metadata").op(opEmptyDict).str(key).obj(mod2x, "BytesStorageMetadata").op(opSetItem)
	p.str("storage_data").op(opEmptyDict).index2x(key, nil, 0).storageInfo2x(object, 0, 10, nil).op(opSetItem)
	return p.op(opSetItems)
}

// Issue 29, the A/B case: BUILD with a (dict, slotstate) pair. CPython's
// load_build updates the instance __dict__ with the dict, then setattr()s
// every slot-state item, so the slot state wins: the Go reader reads the
// same checkpoint (B), never the dict's (A).
func TestBuildSlotStateWinsAsInCPython(t *testing.T) {
	p := newPickle(4).obj(mod2x, "Metadata")
	p.bytesCheckpointState("a", "A.distcp")
	p.bytesCheckpointState("b", "B.distcp")
	p.op(opTuple2, opBuild)
	c, err := DecodeMetadata(p.stop())
	require.NoError(t, err)
	require.Len(t, c.Bytes, 1)
	assert.Equal(t, "b", c.Bytes[0].Key)
	assert.Equal(t, "B.distcp", c.Bytes[0].Object)

	// (None, slots): the slot state alone.
	p = newPickle(4).obj(mod2x, "Metadata").op(opNone)
	p.bytesCheckpointState("b", "B.distcp").op(opTuple2, opBuild)
	c, err = DecodeMetadata(p.stop())
	require.NoError(t, err)
	assert.Equal(t, "b", c.Bytes[0].Key)

	// Two BUILDs: the second updates the first's fields, as in CPython.
	p = newPickle(4).obj(mod2x, "Metadata")
	p.bytesCheckpointState("a", "A.distcp").op(opBuild)
	p.bytesCheckpointState("b", "B.distcp").op(opBuild)
	c, err = DecodeMetadata(p.stop())
	require.NoError(t, err)
	assert.Equal(t, "b", c.Bytes[0].Key)
}

// The state dict is copied into the instance at BUILD time (CPython's
// inst.__dict__.update): changing the dict afterwards through the memo
// does not change the object.
func TestBuildCopiesTheStateDict(t *testing.T) {
	p := newPickle(4).obj(mod2x, "Metadata")
	p.bytesCheckpointState("a", "A.distcp").op(opMemoize) // memo 0: the state dict
	p.op(opBuild)
	// Replace state_dict_metadata and storage_data in the memoised dict.
	p.op(opBinGet, 0)
	p.str("state_dict_metadata").op(opEmptyDict).str("b").obj(mod2x, "BytesStorageMetadata").op(opSetItem, opSetItem)
	p.op(opPop)
	c, err := DecodeMetadata(p.stop())
	require.NoError(t, err)
	require.Len(t, c.Bytes, 1)
	assert.Equal(t, "a", c.Bytes[0].Key)
}

func TestBuildStatesCPythonRefuses(t *testing.T) {
	cases := map[string]*pk{
		// MetadataIndex is a frozen dataclass: setattr raises.
		"slot state on a frozen MetadataIndex": newPickle(4).obj(mod2x, "MetadataIndex").op(opNone, opEmptyDict).str("fqn").str("x").op(opSetItem, opTuple2, opBuild),
		// A state that is not a dict has no .items().
		"list state":                         newPickle(4).obj(mod2x, "Metadata").op(opEmptyList).int(1).op(opAppend, opBuild),
		"slot state list":                    newPickle(4).obj(mod2x, "Metadata").op(opNone, opEmptyList).int(1).op(opAppend, opTuple2, opBuild),
		"non-string slot":                    newPickle(4).obj(mod2x, "Metadata").op(opNone, opEmptyDict).int(1).int(2).op(opSetItem, opTuple2, opBuild),
		"TensorProperties dict state":        newPickle(4).obj(mod2x, "TensorProperties").op(opEmptyDict).str("dtype").sglobal("torch", "float32").op(opSetItem, opBuild),
		"TensorProperties 4-tuple":           newPickle(4).obj(mod2x, "TensorProperties").op(opMark).sglobal("torch", "float32").op(opNone, opNewFalse, opNone, opTuple, opBuild),
		"TensorProperties int memory format": newPickle(4).obj(mod2x, "TensorProperties").op(opMark).sglobal("torch", "float32").op(opNone, opNewFalse).int(0).op(opNewFalse, opTuple, opBuild),
		"TensorProperties 1.13 enum in 2.x": newPickle(4).obj(mod2x, "TensorProperties").op(opMark).sglobal("torch", "float32").op(opNone, opNewFalse).
			sglobal("builtins", "getattr").sglobal("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING").str("TORCH_CONTIGUOUS_FORMAT").op(opTuple2, opReduce, opNewFalse, opTuple, opBuild),
		// OrderedDict.__new__ ignores its arguments; refused rather than read as items.
		"NEWOBJ OrderedDict with items": newPickle(4).sglobal("collections", "OrderedDict").op(opEmptyList).str("k").int(1).op(opTuple2, opAppend, opTuple1, opNewObj),
		"NEWOBJ path":                   newPickle(4).sglobal("pathlib", "PosixPath").str("/x").op(opTuple1, opNewObj),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := unpickle(p.stop(), nil)
			require.Error(t, err)
		})
	}
}

// DCP classes are allowed under the module that defines them only: any
// other submodule would make CPython import it.
func TestDCPClassesOnlyUnderTheirModule(t *testing.T) {
	for _, g := range [][2]string{
		{"torch.distributed.checkpoint.state_dict_loader", "Metadata"},
		{"torch.distributed.checkpoint.filesystem", "Metadata"},
		{"torch.distributed.checkpoint.metadata", "_StorageInfo"},
		{"torch.distributed.checkpoint.nonexistent", "MetadataIndex"},
	} {
		_, err := lookupGlobal(g[0], g[1])
		require.ErrorIs(t, err, ErrForbiddenGlobal, g)
	}
	for _, g := range [][2]string{
		{"torch.distributed.checkpoint.metadata", "Metadata"},
		{"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
		{"torch.distributed._shard.checkpoint.metadata", "Metadata"},
		{"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},
	} {
		_, err := lookupGlobal(g[0], g[1])
		require.NoError(t, err, g)
	}
}

// Dict keys are equal as in Python: a later equal key keeps the first
// one's place and takes its value (1 == True == 1.0).
func TestDictKeysAsInPython(t *testing.T) {
	p := newPickle(2).op(opEmptyDict, opMark)
	p.int(1).str("a").str("k").str("x").op(opNewTrue).str("b").float(1.0).str("c").str("k").str("y")
	p.op(opSetItems)
	v, err := unpickle(p.stop(), nil)
	require.NoError(t, err)
	budget := 100
	got, err := plain(v, 0, &budget)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"1": "c", "k": "y"}, got)
	d := v.(*pyDict)
	assert.Equal(t, []any{int64(1), "k"}, d.keys, "the first key stays, in its place")

	// NaN keys are refused (each NaN is its own key in Python).
	_, err = unpickle(newPickle(2).op(opEmptyDict).float(math.NaN()).int(1).op(opSetItem).stop(), nil)
	require.ErrorIs(t, err, ErrMalformed)
}

// The memo is dense, as picklers write it: a PUT that skips ahead is
// refused (CPython's C unpickler would size its memo array by the index:
// 5 bytes asking for gigabytes).
func TestMemoIndexSkippingAheadIsRefused(t *testing.T) {
	for _, pkl := range [][]byte{
		append(newPickle(2).op(opNone).b, opLongBinPut, 0xff, 0xff, 0xff, 0x7f, opStop),
		append(newPickle(2).op(opNone).b, opBinPut, 1, opStop),
	} {
		_, err := unpickle(pkl, nil)
		require.ErrorIs(t, err, ErrMalformed)
		assert.Contains(t, err.Error(), "skips ahead")
	}
	// Overwriting and adding the next entry are fine; GET past the end is not.
	v, err := unpickle(append(newPickle(2).int(1).b, opBinPut, 0, opPop, 'K', 2, opBinPut, 0, opBinPut, 1, opPop, opBinGet, 0, opStop), nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2), v)
	_, err = unpickle(append(newPickle(2).int(1).b, opMemoize, opBinGet, 1, opStop), nil)
	require.ErrorIs(t, err, ErrMalformed)
}

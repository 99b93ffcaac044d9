package torchdcp

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Values built by the unpickler. Python scalars map to nil, bool, int64,
// float64, string and []byte; containers and the few torch objects the
// allow-list admits get the types below. Nothing here runs Python code:
// "calling" an allowed global builds one of these plain records.
type (
	// pyTuple is an immutable Python tuple.
	pyTuple []any
	// pyList is a Python list (a pointer so APPEND through a memo
	// reference mutates the shared list, as in Python).
	pyList struct {
		items []any
		// set: a set or frozenset (the same operations, another type).
		set bool
	}
	// pyDict is an insertion-ordered Python dict; keys may be any value
	// (DCP uses MetadataIndex objects as keys), so it is a pair list.
	pyDict struct {
		keys, vals []any
		idx        map[string]int // position of each string key
		// attrs is the instance state BUILD gives an OrderedDict (a
		// module state dict's _metadata); it is not part of the items.
		attrs any
	}
	// pyGlobal is an allowed global reference (a class or function).
	pyGlobal struct {
		module, name string
		kind         globalKind
		// family is "torch-1.13" or "torch-2.x" for DCP classes.
		family string
		// dtype is the ckptkit dtype name of a storage class.
		dtype string
	}
	// pyObject is an instance of an allowed DCP class (NEWOBJ + BUILD).
	pyObject struct {
		class *pyGlobal
		// fields is the instance __dict__ the BUILDs gave a dataclass,
		// as CPython's load_build fills it (see build).
		fields *pyDict
		// state is what the last BUILD handed TensorProperties.__setstate__.
		state any
	}
	// torchSize is a torch.Size.
	torchSize []int64
	// torchDType is a torch dtype global (torch.float32, ...); ckpt is the
	// ckptkit dtype name, "" when ckptkit has none.
	torchDType struct{ torch, ckpt string }
	// torchLayout is the result of torch.serialization._get_layout.
	torchLayout string
	// enumMember is a member of a memory-format encoding enum.
	enumMember struct{ class, member string }
	// storageRef is a tensor storage named by a torch.save persistent id.
	storageRef struct {
		dtype, key, location string
		numel                int64
	}
	// tensorRef is a torch._utils._rebuild_tensor_v2 call's arguments.
	tensorRef struct {
		storage      *storageRef
		offset       int64
		size, stride []int64
	}
)

type globalKind int

const (
	kindDCPClass      globalKind = iota // NEWOBJ + BUILD target
	kindEnumClass                       // MEM_FORMAT_ENCODING (getattr / call)
	kindSize                            // torch.Size
	kindGetLayout                       // torch.serialization._get_layout
	kindGetattr                         // builtins.getattr
	kindOrderedDict                     // collections.OrderedDict
	kindRebuildTensor                   // torch._utils._rebuild_tensor_v2
	kindStorage                         // torch.FloatStorage, ...
	kindCodecsEncode                    // _codecs.encode (protocol-2 bytes)
	kindSet                             // builtins.set / frozenset
	kindPath                            // pathlib paths (StorageMeta.checkpoint_id)
	kindDType                           // torch.float32, ... (pushed as a torchDType)
)

// Module families of DCP's own classes.
const (
	family113 = "torch-1.13"
	family2x  = "torch-2.x"
)

// storageClasses maps torch's legacy typed storage classes to ckptkit dtypes.
var storageClasses = map[string]string{
	"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
	"BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
	"ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
	"BoolStorage": "bool", "ComplexFloatStorage": "complex64",
}

// torchDTypes maps torch dtype attribute names to ckptkit dtypes; "" marks a
// dtype torch has and ckptkit does not (ErrUnsupportedDType when used).
var torchDTypes = map[string]string{
	"float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
	"float16": "float16", "half": "float16", "bfloat16": "bfloat16",
	"int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
	"int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
	"complex64": "complex64", "cfloat": "complex64",
	"complex128": "", "cdouble": "", "complex32": "", "chalf": "",
	"uint16": "", "uint32": "", "uint64": "",
	"float8_e4m3fn": "", "float8_e5m2": "", "float8_e4m3fnuz": "", "float8_e5m2fnuz": "",
	"qint8": "", "quint8": "", "qint32": "", "quint4x2": "", "quint2x4": "",
}

// memFormatMembers are the members of (_)MEM_FORMAT_ENCODING by value.
var memFormatMembers = []string{"TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"}

// DCP's own classes, by module. Each is allowed under exactly the module
// that defines it (a pickle names the defining module), never under another
// module of the package: CPython would import that other module.
var dcpModules = map[string]struct {
	family string
	names  []string
}{
	"torch.distributed._shard.checkpoint.metadata": {family113, []string{
		"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex"}},
	"torch.distributed._shard.checkpoint.filesystem":   {family113, []string{"_StorageInfo"}},
	"torch.distributed._shard.sharded_tensor.metadata": {family113, []string{"TensorProperties"}},
	"torch.distributed.checkpoint.metadata": {family2x, []string{
		"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
		"TensorProperties", "StorageMeta"}},
	"torch.distributed.checkpoint.filesystem": {family2x, []string{"_StorageInfo"}},
}

// allowList is every global a pickle may name: module -> name -> the
// global it resolves to. It is the one allow-list of the Go unpickler, and
// python/ckptkit/torch/pickle_allowlist.json, which ckptkit's Python reader
// checks bytes items with, must list exactly the same globals
// (TestAllowListMatchesPython).
var allowList = buildAllowList()

func buildAllowList() map[string]map[string]*pyGlobal {
	out := map[string]map[string]*pyGlobal{}
	add := func(module, name string, g pyGlobal) {
		if out[module] == nil {
			out[module] = map[string]*pyGlobal{}
		}
		g.module, g.name = module, name
		out[module][name] = &g
	}
	for module, m := range dcpModules {
		for _, name := range m.names {
			add(module, name, pyGlobal{kind: kindDCPClass, family: m.family})
		}
	}
	add("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING", pyGlobal{kind: kindEnumClass, family: family113})
	add("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", pyGlobal{kind: kindEnumClass, family: family2x})
	add("torch", "Size", pyGlobal{kind: kindSize})
	for name, dt := range storageClasses {
		add("torch", name, pyGlobal{kind: kindStorage, dtype: dt})
	}
	for name, dt := range torchDTypes {
		add("torch", name, pyGlobal{kind: kindDType, dtype: dt})
	}
	add("torch.serialization", "_get_layout", pyGlobal{kind: kindGetLayout})
	add("torch._utils", "_rebuild_tensor_v2", pyGlobal{kind: kindRebuildTensor})
	add("collections", "OrderedDict", pyGlobal{kind: kindOrderedDict})
	for _, module := range []string{"builtins", "__builtin__"} {
		add(module, "getattr", pyGlobal{kind: kindGetattr})
		add(module, "set", pyGlobal{kind: kindSet})
		add(module, "frozenset", pyGlobal{kind: kindSet})
	}
	add("_codecs", "encode", pyGlobal{kind: kindCodecsEncode})
	for _, module := range []string{"pathlib", "pathlib._local"} {
		for _, name := range []string{"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"} {
			add(module, name, pyGlobal{kind: kindPath})
		}
	}
	return out
}

// kindNames name the kinds in python/ckptkit/torch/pickle_allowlist.json.
var kindNames = map[globalKind]string{
	kindDCPClass: "dcp-class", kindEnumClass: "enum-class", kindSize: "size", kindGetLayout: "get-layout",
	kindGetattr: "getattr", kindOrderedDict: "ordered-dict", kindRebuildTensor: "rebuild-tensor",
	kindStorage: "storage", kindCodecsEncode: "codecs-encode", kindSet: "set", kindPath: "path", kindDType: "dtype",
}

// lookupGlobal resolves a GLOBAL / STACK_GLOBAL reference against the
// allow-list. It returns the value to push: a *pyGlobal for classes and
// functions, a torchDType for dtype globals.
func lookupGlobal(module, name string) (any, error) {
	g, ok := allowList[module][name]
	if !ok {
		return nil, &ForbiddenGlobalError{Module: module, Name: name}
	}
	if g.kind == kindDType {
		return torchDType{torch: "torch." + name, ckpt: g.dtype}, nil
	}
	return g, nil
}

// call applies an allowed callable global to its positional arguments
// (REDUCE). Each case builds a plain value; anything unexpected is refused.
func call(fn any, args pyTuple) (any, error) {
	g, ok := fn.(*pyGlobal)
	if !ok {
		return nil, malformed("REDUCE on a non-callable %s", typeName(fn))
	}
	switch g.kind {
	case kindSize:
		if len(args) != 1 {
			return nil, malformed("torch.Size takes 1 argument, got %d", len(args))
		}
		dims, err := intSeq(args[0])
		if err != nil {
			return nil, fmt.Errorf("torch.Size: %w", err)
		}
		return torchSize(dims), nil
	case kindGetLayout:
		if len(args) != 1 {
			return nil, malformed("_get_layout takes 1 argument, got %d", len(args))
		}
		s, ok := args[0].(string)
		if !ok || !strings.HasPrefix(s, "torch.") {
			return nil, malformed("_get_layout argument %s", typeName(args[0]))
		}
		return torchLayout(s), nil
	case kindGetattr:
		if len(args) != 2 {
			return nil, malformed("getattr takes 2 arguments, got %d", len(args))
		}
		cls, ok1 := args[0].(*pyGlobal)
		member, ok2 := args[1].(string)
		if !ok1 || !ok2 || cls.kind != kindEnumClass {
			return nil, &ForbiddenGlobalError{Module: "builtins", Name: "getattr(" + typeName(args[0]) + ")"}
		}
		for _, m := range memFormatMembers {
			if m == member {
				return enumMember{class: cls.name, member: member}, nil
			}
		}
		return nil, malformed("unknown %s member %q", cls.name, member)
	case kindEnumClass:
		if len(args) != 1 {
			return nil, malformed("%s takes 1 argument, got %d", g.name, len(args))
		}
		v, ok := args[0].(int64)
		if !ok || v < 0 || v >= int64(len(memFormatMembers)) {
			return nil, malformed("%s(%s) is not a member", g.name, typeName(args[0]))
		}
		return enumMember{class: g.name, member: memFormatMembers[v]}, nil
	case kindOrderedDict:
		d := &pyDict{}
		if len(args) == 0 {
			return d, nil
		}
		if len(args) != 1 {
			return nil, malformed("OrderedDict takes at most 1 argument, got %d", len(args))
		}
		items, ok := seqItems(args[0])
		if !ok {
			return nil, malformed("OrderedDict(%s)", typeName(args[0]))
		}
		for _, it := range items {
			pair, ok := seqItems(it)
			if !ok || len(pair) != 2 {
				return nil, malformed("OrderedDict item is not a pair")
			}
			d.set(pair[0], pair[1])
		}
		return d, nil
	case kindSet:
		if len(args) == 0 {
			return &pyList{set: true}, nil
		}
		items, ok := seqItems(args[0])
		if len(args) != 1 || !ok {
			return nil, malformed("%s arguments", g.name)
		}
		return &pyList{items: append([]any(nil), items...), set: true}, nil
	case kindCodecsEncode:
		if len(args) != 2 {
			return nil, malformed("_codecs.encode takes 2 arguments, got %d", len(args))
		}
		s, ok1 := args[0].(string)
		enc, ok2 := args[1].(string)
		if !ok1 || !ok2 || (enc != "latin1" && enc != "latin-1") {
			return nil, malformed("_codecs.encode only decodes latin1 strings")
		}
		out := make([]byte, 0, len(s))
		for _, r := range s {
			if r > 0xff {
				return nil, malformed("_codecs.encode: rune %U is not latin1", r)
			}
			out = append(out, byte(r))
		}
		return out, nil
	case kindPath:
		parts := make([]string, 0, len(args))
		for _, a := range args {
			s, ok := a.(string)
			if !ok {
				return nil, malformed("%s part %s", g.name, typeName(a))
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, "/"), nil
	case kindRebuildTensor:
		return rebuildTensor(args)
	}
	return nil, &ForbiddenGlobalError{Module: g.module, Name: g.name + " (as a function)"}
}

// rebuildTensor checks the arguments of _rebuild_tensor_v2(storage,
// storage_offset, size, stride, requires_grad, backward_hooks[, metadata]).
func rebuildTensor(args pyTuple) (any, error) {
	if len(args) != 6 && len(args) != 7 {
		return nil, malformed("_rebuild_tensor_v2 takes 6 or 7 arguments, got %d", len(args))
	}
	st, ok := args[0].(*storageRef)
	if !ok {
		return nil, malformed("_rebuild_tensor_v2 storage is %s", typeName(args[0]))
	}
	off, ok := args[1].(int64)
	if !ok || off < 0 {
		return nil, malformed("_rebuild_tensor_v2 storage_offset %v", args[1])
	}
	size, err := intSeq(args[2])
	if err != nil {
		return nil, fmt.Errorf("_rebuild_tensor_v2 size: %w", err)
	}
	stride, err := intSeq(args[3])
	if err != nil {
		return nil, fmt.Errorf("_rebuild_tensor_v2 stride: %w", err)
	}
	if len(size) != len(stride) {
		return nil, malformed("_rebuild_tensor_v2 size %v and stride %v differ in rank", size, stride)
	}
	if _, ok := args[4].(bool); !ok {
		return nil, malformed("_rebuild_tensor_v2 requires_grad %s", typeName(args[4]))
	}
	if hooks, ok := args[5].(*pyDict); !ok || len(hooks.keys) != 0 {
		return nil, malformed("_rebuild_tensor_v2 backward_hooks must be an empty OrderedDict")
	}
	return &tensorRef{storage: st, offset: off, size: size, stride: stride}, nil
}

// newObject applies NEWOBJ: only DCP classes may be instantiated, and only
// with no constructor arguments (dataclasses pickle their fields in BUILD).
func newObject(cls any, args pyTuple) (any, error) {
	g, ok := cls.(*pyGlobal)
	if !ok {
		return nil, malformed("NEWOBJ on %s", typeName(cls))
	}
	switch g.kind {
	case kindDCPClass:
		if len(args) != 0 {
			return nil, malformed("NEWOBJ %s with %d arguments", g.name, len(args))
		}
		return &pyObject{class: g}, nil
	case kindOrderedDict, kindSet:
		// cls.__new__(cls, *args) in CPython: an empty container whatever
		// the arguments (dict.__new__ and set.__new__ ignore them; __init__
		// is not run). Picklers never write it with arguments: refused.
		if len(args) != 0 {
			return nil, malformed("NEWOBJ %s with %d arguments", g.name, len(args))
		}
		return call(g, args)
	}
	return nil, &ForbiddenGlobalError{Module: g.module, Name: g.name + " (instantiated)"}
}

// set stores v under k as CPython's dict does: a key equal to an earlier
// one (strings; ints and bools, where True == 1; None) keeps the earlier
// key's place and takes the later value. Keys without a scalar identity
// (objects, tuples) are appended as they come: DecodeMetadata refuses
// duplicate storage_data keys, and values with such keys are opaque.
func (d *pyDict) set(k, v any) {
	if ks, ok := scalarKey(k); ok {
		if i, ok := d.idx[ks]; ok {
			d.vals[i] = v
			return
		}
		if d.idx == nil {
			d.idx = make(map[string]int)
		}
		d.idx[ks] = len(d.keys)
	}
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
}

// scalarKey is the identity of a scalar dict key under Python's equality:
// a string is itself, an int (or bool) and an integral float are one
// number. NaN has none (hashable refuses it).
func scalarKey(k any) (string, bool) {
	switch t := k.(type) {
	case string:
		return "s" + t, true
	case nil:
		return "n", true
	case bool:
		if t {
			return "i1", true
		}
		return "i0", true
	case int64:
		return "i" + strconv.FormatInt(t, 10), true
	case float64:
		if t == math.Trunc(t) && t >= -(1<<63) && t < 1<<63 {
			return "i" + strconv.FormatInt(int64(t), 10), true
		}
		return "f" + strconv.FormatFloat(t, 'g', -1, 64), true
	}
	return "", false
}

// get returns the value of a string key.
func (d *pyDict) get(key string) (any, bool) {
	if i, ok := d.idx["s"+key]; ok {
		return d.vals[i], true
	}
	return nil, false
}

// seqItems returns the items of a tuple or list.
func seqItems(v any) ([]any, bool) {
	switch t := v.(type) {
	case pyTuple:
		return t, true
	case *pyList:
		return t.items, true
	}
	return nil, false
}

// intSeq converts a tuple, list or torch.Size of ints.
func intSeq(v any) ([]int64, error) {
	if s, ok := v.(torchSize); ok {
		return append([]int64{}, s...), nil
	}
	items, ok := seqItems(v)
	if !ok {
		return nil, malformed("want a sequence of ints, got %s", typeName(v))
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := it.(int64)
		if !ok {
			return nil, malformed("want an int at position %d, got %s", i, typeName(it))
		}
		out[i] = n
	}
	return out, nil
}

// typeName describes a value for error messages without printing it.
func typeName(v any) string {
	switch t := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case pyTuple:
		return "tuple"
	case *pyList:
		return "list"
	case *pyDict:
		return "dict"
	case *pyGlobal:
		return t.module + "." + t.name
	case *pyObject:
		return t.class.module + "." + t.class.name + " object"
	case torchSize:
		return "torch.Size"
	case torchDType:
		return t.torch
	case torchLayout:
		return "torch.layout"
	case enumMember:
		return t.class
	case *storageRef:
		return "storage"
	case *tensorRef:
		return "tensor"
	}
	return fmt.Sprintf("%T", v)
}

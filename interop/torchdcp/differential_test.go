package torchdcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The differential corpus (issue 29, one grammar): every pickle of the DCP
// fixtures (torch 1.13 and 2.x .metadata objects and every item's
// data.pkl), the FuzzUnpickle corpus and crafted cases, each with what the
// Go unpickler reads from it in a canonical JSON form (canonical), or its
// refusal. python/tests/test_differential.py reads the same pickles with
// CPython (pickle._Unpickler, torch's own DCP classes) in the torch
// environments and requires the same value, field by field, wherever the Go
// unpickler accepts the input. testdata/differential.json holds the corpus;
// TestDifferentialCorpusIsCurrent fails when it is out of date
// (CKPTKIT_WRITE_DIFFERENTIAL=1 rewrites it).
const differentialFile = "testdata/differential.json"

type diffCase struct {
	Name string `json:"name"`
	// Pickle is the pickle, base64.
	Pickle string `json:"pickle"`
	// Persistent: a torch.save data.pkl (persistent ids name storages).
	Persistent bool `json:"persistent"`
	// Go is the canonical value (absent when Go refuses the input).
	Go any `json:"go,omitempty"`
	// GoError is "forbidden-global" or "malformed" when Go refuses it.
	GoError string `json:"go_error,omitempty"`
	// BothRefuse: CPython must refuse it too (crafted hostile cases).
	BothRefuse bool `json:"both_refuse,omitempty"`
}

// canonical renders an unpickled value as JSON the Python side reproduces
// from CPython's objects: ints as {"int": decimal}, floats as {"float": the
// IEEE bits in hex}, containers tagged, DCP objects as their fields sorted
// by name.
func canonical(v any, depth int) (any, error) {
	if depth > maxValueDepth {
		return nil, malformed("nested too deep (or cyclic)")
	}
	seq := func(items []any) ([]any, error) {
		out := make([]any, len(items))
		for i, it := range items {
			c, err := canonical(it, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	ints := func(v []int64) []any {
		out := make([]any, len(v))
		for i, n := range v {
			out[i] = map[string]any{"int": strconv.FormatInt(n, 10)}
		}
		return out
	}
	tag := func(t string, v any, err error) (any, error) {
		if err != nil {
			return nil, err
		}
		return map[string]any{t: v}, nil
	}
	switch t := v.(type) {
	case nil, bool, string:
		return t, nil
	case int64:
		return map[string]any{"int": strconv.FormatInt(t, 10)}, nil
	case float64:
		return map[string]any{"float": fmt.Sprintf("%016x", math.Float64bits(t))}, nil
	case []byte:
		return map[string]any{"bytes": base64.StdEncoding.EncodeToString(t)}, nil
	case pyTuple:
		s, err := seq(t)
		return tag("tuple", s, err)
	case *pyList:
		s, err := seq(t.items)
		if err != nil || !t.set {
			return tag("list", s, err)
		}
		sortCanonical(s)
		return tag("set", s, nil)
	case *pyDict:
		pairs := make([]any, len(t.keys))
		for i, k := range t.keys {
			p, err := seq([]any{k, t.vals[i]})
			if err != nil {
				return nil, err
			}
			pairs[i] = p
		}
		return tag("dict", pairs, nil)
	case torchSize:
		return tag("size", ints(t), nil)
	case torchDType:
		return tag("dtype", t.torch, nil)
	case torchLayout:
		return tag("layout", string(t), nil)
	case enumMember:
		return tag("enum", t.member, nil)
	case *pyGlobal:
		return tag("global", t.module+"."+t.name, nil)
	case *storageRef:
		return tag("storage", []any{t.dtype, t.key, t.location, map[string]any{"int": strconv.FormatInt(t.numel, 10)}}, nil)
	case *tensorRef:
		st, err := canonical(t.storage, depth+1)
		if err != nil {
			return nil, err
		}
		return tag("tensor", []any{st, map[string]any{"int": strconv.FormatInt(t.offset, 10)}, ints(t.size), ints(t.stride)}, nil)
	case *pyObject:
		fields := map[string]any{}
		if t.class.name == "TensorProperties" {
			st := t.state.(pyTuple)
			for i, name := range []string{"dtype", "layout", "requires_grad", "memory_format", "pin_memory"} {
				fields[name] = st[i]
			}
			fields["memory_format"] = canonicalAs{memoryFormats[st[3].(enumMember).member]}
		} else if t.fields != nil {
			for i, k := range t.fields.keys {
				ks, ok := k.(string)
				if !ok {
					return nil, malformed("non-string attribute")
				}
				fields[ks] = t.fields.vals[i]
			}
		}
		names := make([]string, 0, len(fields))
		for k := range fields {
			names = append(names, k)
		}
		sort.Strings(names)
		pairs := make([]any, len(names))
		for i, k := range names {
			c, err := canonical(fields[k], depth+1)
			if err != nil {
				return nil, err
			}
			pairs[i] = []any{k, c}
		}
		return map[string]any{"object": t.class.name, "fields": pairs}, nil
	case canonicalAs:
		return t.v, nil
	}
	return nil, fmt.Errorf("no canonical form for %T", v)
}

// canonicalAs is a value already in canonical form.
type canonicalAs struct{ v any }

var memoryFormats = map[string]any{
	"TORCH_CONTIGUOUS_FORMAT": map[string]any{"memory_format": "torch.contiguous_format"},
	"TORCH_CHANNELS_LAST":     map[string]any{"memory_format": "torch.channels_last"},
	"TORCH_PRESERVE_FORMAT":   map[string]any{"memory_format": "torch.preserve_format"},
}

// sortCanonical orders a set's items by their JSON text (the Python side
// sorts the same way: json.dumps(sort_keys=True, separators=(",", ":"),
// ensure_ascii=False)).
func sortCanonical(items []any) {
	key := func(v any) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		return strings.TrimSuffix(b.String(), "\n")
	}
	sort.SliceStable(items, func(i, j int) bool { return key(items[i]) < key(items[j]) })
}

func goView(pkl []byte, persistent bool) (any, string) {
	var load func(any) (any, error)
	if persistent {
		load = storageLoader()
	}
	v, err := unpickle(pkl, load)
	if err == nil {
		v, err = canonical(v, 0)
	}
	switch {
	case err == nil:
		return v, ""
	case errors.Is(err, ErrForbiddenGlobal):
		return nil, "forbidden-global"
	default:
		return nil, "malformed"
	}
}

// differentialCorpus builds the corpus (without the Go views).
func differentialCorpus(t *testing.T) []diffCase {
	var out []diffCase
	add := func(name string, pkl []byte, persistent, bothRefuse bool) {
		out = append(out, diffCase{Name: name, Pickle: base64.StdEncoding.EncodeToString(pkl), Persistent: persistent, BothRefuse: bothRefuse})
	}
	for _, root := range []string{"testdata"} {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != ObjectKey {
				return err
			}
			dir := filepath.Dir(p)
			rel, _ := filepath.Rel(filepath.Join(root, ".."), dir)
			rel = filepath.ToSlash(rel)
			raw, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			add(rel+"/.metadata", raw, false, false)
			c, err := DecodeMetadata(raw)
			if err != nil {
				return nil // a variant the Go reader refuses: its .metadata is in, its items are not
			}
			files := map[string][]byte{}
			item := func(key, object string, off, n int64) {
				if files[object] == nil {
					b, err := os.ReadFile(filepath.Join(dir, object))
					if err != nil {
						return
					}
					files[object] = b
				}
				b := files[object]
				if off+n > int64(len(b)) {
					return
				}
				a, err := openArchive(b[off : off+n])
				if err != nil {
					return
				}
				pkl, err := a.pickle()
				if err != nil {
					return
				}
				add(fmt.Sprintf("%s/%s@%s:%d", rel, key, object, off), pkl, true, false)
			}
			for _, b := range c.Bytes {
				item(b.Key, b.Object, b.Offset, b.Length)
			}
			for _, te := range c.Tensors {
				for _, ch := range te.Chunks {
					item(te.Key, ch.Object, ch.Offset, ch.Length)
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	// The FuzzUnpickle corpus.
	ents, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzUnpickle"))
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzUnpickle", e.Name()))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], "[]byte(") {
			continue
		}
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		require.NoError(t, err)
		add("fuzz/"+e.Name(), []byte(s), true, false)
	}
	// Crafted cases.
	ab := newPickle(4).obj(mod2x, "Metadata")
	ab.bytesCheckpointState("a", "A.distcp").bytesCheckpointState("b", "B.distcp").op(opTuple2, opBuild)
	add("crafted/build-dict-and-slot-state", ab.stop(), false, false)
	two := newPickle(4).obj(mod2x, "Metadata")
	two.bytesCheckpointState("a", "A.distcp").op(opBuild).bytesCheckpointState("b", "B.distcp").op(opBuild)
	add("crafted/two-builds", two.stop(), false, false)
	cp := newPickle(4).obj(mod2x, "Metadata")
	cp.bytesCheckpointState("a", "A.distcp").op(opMemoize, opBuild, opBinGet, 0)
	cp.str("state_dict_metadata").op(opEmptyDict, opSetItem, opPop)
	add("crafted/state-dict-changed-after-build", cp.stop(), false, false)
	keys := newPickle(2).op(opEmptyDict, opMark)
	keys.int(1).str("a").str("k").str("x").op(opNewTrue).str("b").float(1.0).str("c").str("k").str("y").op(opSetItems)
	add("crafted/equal-dict-keys", keys.stop(), false, false)
	set := newPickle(4).op(opEmptySet, opMark).str("b").str("a").int(3).op(opAddItems)
	add("crafted/set", set.stop(), false, false)
	fs := newPickle(4).op(opMark).str("b").str("a").op(opFrozenSet)
	add("crafted/frozenset", fs.stop(), false, false)
	od := newPickle(2).global("collections", "OrderedDict").op(opEmptyTuple, opReduce, opMark).str("z").int(1).str("a").int(2).op(opSetItems)
	add("crafted/ordered-dict", od.stop(), false, false)
	memo := append(newPickle(2).int(1).b, opBinPut, 0, opPop, 'K', 2, opBinPut, 0, opBinPut, 1, opPop, opBinGet, 0, opStop)
	add("crafted/memo-overwrite", memo, false, false)
	add("crafted/memo-skip-ahead", append(newPickle(2).op(opNone).b, opLongBinPut, 0xff, 0xff, 0xff, 0x0f, opStop), false, true)
	add("crafted/os-system", newPickle(2).global("posix", "system").str("id").op(opTuple1, opReduce).stop(), false, true)
	add("crafted/getattr-escape", newPickle(2).global("builtins", "getattr").global("collections", "OrderedDict").str("fromkeys").op(opTuple2, opReduce).stop(), false, true)
	add("crafted/inst", []byte("\x80\x02(iposix\nsystem\n."), false, true)
	add("crafted/dcp-class-other-module", newPickle(4).sglobal("torch.distributed.checkpoint.planner", "Metadata").stop(), false, true)
	return out
}

func TestDifferentialCorpusIsCurrent(t *testing.T) {
	cases := differentialCorpus(t)
	for i := range cases {
		pkl, err := base64.StdEncoding.DecodeString(cases[i].Pickle)
		require.NoError(t, err)
		cases[i].Go, cases[i].GoError = goView(pkl, cases[i].Persistent)
		if cases[i].BothRefuse {
			require.NotEmpty(t, cases[i].GoError, cases[i].Name)
		}
	}
	// One case per line.
	var buf bytes.Buffer
	buf.WriteString("{\"cases\": [\n")
	for i, c := range cases {
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(c))
		if i < len(cases)-1 {
			buf.Truncate(buf.Len() - 1)
			buf.WriteString(",\n")
		}
	}
	buf.WriteString("]}\n")
	if os.Getenv("CKPTKIT_WRITE_DIFFERENTIAL") == "1" {
		require.NoError(t, os.WriteFile(differentialFile, buf.Bytes(), 0o644))
	}
	stored, err := os.ReadFile(differentialFile)
	require.NoError(t, err)
	require.True(t, bytes.Equal(stored, buf.Bytes()), "%s is out of date: CKPTKIT_WRITE_DIFFERENTIAL=1 go test -run TestDifferentialCorpusIsCurrent ./interop/torchdcp", differentialFile)
}

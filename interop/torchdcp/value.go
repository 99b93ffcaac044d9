package torchdcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// maxValueDepth bounds the nesting of a decoded value (and so the recursion
// of the conversion, which also stops reference cycles).
const maxValueDepth = 256

// DecodeValue decodes one DCP non-tensor (BYTE_IO) item: a torch.save
// archive of a plain Python value. It returns int64, float64, string, bool,
// nil, []byte, []any (lists, tuples and sets) and map[string]any (dicts
// whose keys are strings or ints; int keys become decimal strings, as in
// JSON).
//
// Anything else (tensors inside the value, as a 1.13 save of an unflattened
// state dict produces, objects, non-string-or-int keys) gives an error
// wrapping ErrOpaque; a pickle naming a global outside the allow-list gives
// the *ForbiddenGlobalError (ErrForbiddenGlobal, not ErrOpaque: it is not a
// value to skip but an item to report); a malformed item gives ErrMalformed.
func DecodeValue(item []byte) (any, error) {
	a, err := openArchive(item)
	if err != nil {
		return nil, err
	}
	pkl, err := a.pickle()
	if err != nil {
		return nil, err
	}
	v, err := unpickle(pkl, storageLoader())
	if err != nil {
		return nil, fmt.Errorf("value pickle: %w", err)
	}
	budget := 4*len(pkl) + 64
	return plain(v, 0, &budget)
}

// plain converts an unpickled value to plain Go values. budget bounds the
// number of nodes visited, so values that share sub-objects many times
// cannot blow up into exponential work or memory.
func plain(v any, depth int, budget *int) (any, error) {
	*budget--
	if *budget < 0 {
		return nil, malformed("value expands beyond the size of its pickle")
	}
	if depth > maxValueDepth {
		return nil, malformed("value nested deeper than %d levels (or cyclic)", maxValueDepth)
	}
	switch t := v.(type) {
	case nil, bool, int64, float64, string:
		return t, nil
	case []byte:
		return append([]byte{}, t...), nil
	case pyTuple:
		return plainSeq(t, depth, budget)
	case *pyList:
		return plainSeq(t.items, depth, budget)
	case *pyDict:
		out := make(map[string]any, len(t.keys))
		for i, k := range t.keys {
			var ks string
			switch kk := k.(type) {
			case string:
				ks = kk
			case int64:
				ks = strconv.FormatInt(kk, 10)
			default:
				return nil, fmt.Errorf("%w: dict key of type %s", ErrOpaque, typeName(k))
			}
			if _, dup := out[ks]; dup {
				return nil, fmt.Errorf("%w: dict keys collide as %q", ErrOpaque, ks)
			}
			pv, err := plain(t.vals[i], depth+1, budget)
			if err != nil {
				return nil, err
			}
			out[ks] = pv
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: holds a %s", ErrOpaque, typeName(v))
}

func plainSeq(items []any, depth int, budget *int) ([]any, error) {
	out := make([]any, len(items))
	for i, it := range items {
		pv, err := plain(it, depth+1, budget)
		if err != nil {
			return nil, err
		}
		out[i] = pv
	}
	return out, nil
}

// zipMagic starts every torch.save archive (and never a JSON text).
var zipMagic = []byte("PK\x03\x04")

// IsRawItem reports whether a decoded bytes entry is the untouched
// torch.save item (see the "torch-save-bytes" decoder) rather than JSON.
func IsRawItem(b []byte) bool { return bytes.HasPrefix(b, zipMagic) }

// decodeBytesItem is the "torch-save-bytes" chunk decoder: the item's value
// as JSON (tuples and sets become arrays, bytes become base64 strings), or
// the raw item bytes unchanged when the value is well formed but opaque
// (tensors inside it, keys JSON has no form for) or has no JSON form (NaN
// or infinite floats). IsRawItem tells the two apart. A pickle naming a
// global outside the allow-list fails (*ForbiddenGlobalError), as does a
// malformed one: such an item is never handed over, to be unpickled by a
// general unpickler.
func decodeBytesItem(stored []byte, _ string, _ []int64) ([]byte, error) {
	v, err := DecodeValue(stored)
	if errors.Is(err, ErrOpaque) {
		return stored, nil
	}
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return stored, nil
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decodeTensorItem is the "torch-save" chunk decoder: the item's row-major
// bytes, after checking its dtype and shape against the metadata's.
func decodeTensorItem(stored []byte, dtype string, sizes []int64) ([]byte, error) {
	dt, shape, raw, err := DecodeTensor(stored)
	if err != nil {
		return nil, err
	}
	if dt != dtype {
		return nil, fmt.Errorf("%w: item holds %s, metadata says %s", ErrItemMismatch, dt, dtype)
	}
	if !equalInts(shape, sizes) {
		return nil, fmt.Errorf("%w: item has shape %v, metadata says chunk sizes %v", ErrItemMismatch, shape, sizes)
	}
	return raw, nil
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

package diff

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
)

// sameValue reports whether two bytes values hold the same value: equal
// bytes, or both JSON documents (how native checkpoints store non-tensor
// values, and how a DCP item's pickled value reads after decoding) that
// are equal as values: numbers by value (0, 0.0 and 0e0 alike, an integer
// beyond float precision exactly), arrays element by element (a Python
// tuple and list alike), objects member by member whatever their order.
// Anything else (an opaque pickle) is compared as bytes.
func sameValue(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	va, oka := parseJSON(a)
	vb, okb := parseJSON(b)
	return oka && okb && equalJSON(va, vb)
}

func parseJSON(b []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false // trailing data: not one JSON value
	}
	return v, true
}

func equalJSON(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		fx, _, ex := big.ParseFloat(string(x), 10, 256, big.ToNearestEven)
		fy, _, ey := big.ParseFloat(string(y), 10, 256, big.ToNearestEven)
		return ex == nil && ey == nil && fx.Cmp(fy) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	default: // string, bool, nil
		return a == b
	}
}

package statedict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// Flattening errors.
var (
	// ErrFlatten reports nested state that cannot be flattened or a flat
	// StateDict that cannot be rebuilt: a map key that is empty or holds
	// a ".", an unsupported leaf type, or keys that collide ("a" and
	// "a.b").
	ErrFlatten = ckpterr.New(ckpterr.Usage, "cannot flatten state")
	// ErrNoSuchKey reports a key the StateDict does not hold.
	ErrNoSuchKey = ckpterr.New(ckpterr.Usage, "key not in state dict")
)

// Flatten turns nested training state into a flat StateDict.
//
// Walking: map[string]any and []any are walked; path elements are joined
// with "." and list elements are named by their decimal index. A map key
// that is empty or contains "." is an error (the flat key would be
// ambiguous). Empty maps and lists produce no key and do not survive a
// round trip.
//
// Leaves:
//   - *Tensor becomes Whole(t) (sharing its bytes); *Shard is kept as is.
//   - []byte is an opaque byte value, stored as is.
//   - bool, int, int64, float64, string and nil become a byte value holding
//     their JSON encoding, so "optimizer.param_groups.0.lr" holds `0.001`.
//   - anything else is an error naming the path.
//
// Key conventions used by trainers and the loader's resume rules:
//
//	model.<fqn>                         parameters and buffers
//	optimizer.state.<fqn>.<slot>        per-parameter optimizer state (AdamW: step, exp_avg, exp_avg_sq)
//	optimizer.param_groups.<i>.<field>  hyper-parameters of param group i (lr, betas, ...)
//	scheduler.<field>                   LR scheduler state
//	iteration                           the training step
//
// ("optimizer" is the default optimizer prefix; it is a parameter of the
// loader's API, not a fixed word.)
func Flatten(nested map[string]any) (*StateDict, error) {
	sd := New()
	if err := flattenMap(sd, "", nested); err != nil {
		return nil, err
	}
	return sd, nil
}

func join(prefix, elem string) string {
	if prefix == "" {
		return elem
	}
	return prefix + "." + elem
}

func flattenMap(sd *StateDict, prefix string, m map[string]any) error {
	for k, v := range m {
		if k == "" || strings.Contains(k, ".") {
			where := prefix
			if where == "" {
				where = "the top level"
			}
			return fmt.Errorf("%w: map key %q under %s is empty or contains \".\"", ErrFlatten, k, where)
		}
		if err := flattenValue(sd, join(prefix, k), v); err != nil {
			return err
		}
	}
	return nil
}

func flattenValue(sd *StateDict, path string, v any) error {
	switch x := v.(type) {
	case map[string]any:
		return flattenMap(sd, path, x)
	case []any:
		for i, e := range x {
			if err := flattenValue(sd, join(path, strconv.Itoa(i)), e); err != nil {
				return err
			}
		}
		return nil
	case *Tensor:
		if x == nil {
			return fmt.Errorf("%w: %q is a nil *Tensor", ErrFlatten, path)
		}
		if err := x.Check(); err != nil {
			return fmt.Errorf("%w: tensor %q: %w", ErrFlatten, path, err)
		}
		sd.Tensors[path] = Whole(x)
	case *Shard:
		if x == nil {
			return fmt.Errorf("%w: %q is a nil *Shard", ErrFlatten, path)
		}
		if err := x.Check(); err != nil {
			return fmt.Errorf("%w: tensor %q: %w", ErrFlatten, path, err)
		}
		sd.Tensors[path] = x
	case []byte:
		sd.Bytes[path] = x
	case nil, bool, int, int64, float64, string:
		b, err := json.Marshal(x)
		if err != nil {
			return fmt.Errorf("%w: %q: %w", ErrFlatten, path, err)
		}
		sd.Bytes[path] = b
	default:
		return fmt.Errorf("%w: %q has unsupported type %T (want map[string]any, []any, *Tensor, *Shard, []byte, bool, int, int64, float64, string or nil)", ErrFlatten, path, v)
	}
	return nil
}

// Unflatten rebuilds nested state from a flat StateDict, splitting keys at
// ".". Tensors come back as their *Shard (sharing its bytes). A byte value
// that is a JSON scalar comes back decoded as JSON decodes it: float64
// (every number, so an int saved with Flatten returns as float64), string,
// bool or nil; any other byte value (raw bytes, JSON objects or arrays)
// comes back as []byte. Raw []byte values whose text happens to be a JSON
// scalar are therefore decoded too.
//
// A level whose keys are exactly "0".."n-1" becomes a []any; any other
// level stays a map[string]any, with numeric elements as string keys. Keys
// with empty path elements or that collide (a value at "a" and another at
// "a.b") are errors matching ErrFlatten.
func Unflatten(sd *StateDict) (map[string]any, error) {
	root := map[string]any{}
	if sd == nil {
		return root, nil
	}
	for _, key := range sd.Keys() {
		var leaf any
		if s, ok := sd.Tensors[key]; ok {
			leaf = s
		} else {
			leaf = decodeScalar(sd.Bytes[key])
		}
		parts := strings.Split(key, ".")
		node := root
		for i, p := range parts {
			if p == "" {
				return nil, fmt.Errorf("%w: key %q has an empty path element", ErrFlatten, key)
			}
			if i == len(parts)-1 {
				if _, taken := node[p]; taken {
					return nil, fmt.Errorf("%w: key %q collides with a longer key under it", ErrFlatten, key)
				}
				node[p] = leaf
				break
			}
			child, ok := node[p]
			if !ok {
				m := map[string]any{}
				node[p] = m
				node = m
				continue
			}
			m, isMap := child.(map[string]any)
			if !isMap {
				return nil, fmt.Errorf("%w: key %q collides with the value at %q", ErrFlatten, key, strings.Join(parts[:i+1], "."))
			}
			node = m
		}
	}
	return listify(root).(map[string]any), nil
}

// listify turns, bottom-up, every map whose keys are exactly "0".."n-1"
// into a []any. The root map is never turned into a list.
func listify(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	for k, c := range m {
		if cm, isMap := c.(map[string]any); isMap {
			if l := asList(cm); l != nil {
				m[k] = l
			} else {
				m[k] = listify(cm)
			}
		}
	}
	return m
}

// asList returns m as a (recursively listified) []any when its keys are
// exactly "0".."n-1" in canonical decimal form, else nil.
func asList(m map[string]any) []any {
	out := make([]any, len(m))
	for k := range m {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= len(m) || strconv.Itoa(i) != k {
			return nil
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		i, _ := strconv.Atoi(k)
		c := m[k]
		if cm, isMap := c.(map[string]any); isMap {
			if l := asList(cm); l != nil {
				c = l
			} else {
				c = listify(cm)
			}
		}
		out[i] = c
	}
	return out
}

// decodeScalar returns the JSON scalar b encodes, or b itself.
func decodeScalar(b []byte) any {
	t := bytes.TrimSpace(b)
	if len(t) == 0 || t[0] == '{' || t[0] == '[' || !json.Valid(t) {
		return b
	}
	var v any
	if err := json.Unmarshal(t, &v); err != nil {
		return b
	}
	return v
}

// PutJSON stores v's JSON encoding as the byte value key (replacing any
// byte value there). It fails if key is empty, names a tensor, or v does
// not encode.
func (sd *StateDict) PutJSON(key string, v any) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrFlatten)
	}
	if _, isTensor := sd.Tensors[key]; isTensor {
		return fmt.Errorf("%w: key %q already holds a tensor", ErrFlatten, key)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %q as JSON: %w", key, err)
	}
	if sd.Bytes == nil {
		sd.Bytes = map[string][]byte{}
	}
	sd.Bytes[key] = b
	return nil
}

// GetJSON decodes the byte value key into v. A missing key is an error
// matching ErrNoSuchKey; a value that does not decode into v names the
// key.
func (sd *StateDict) GetJSON(key string, v any) error {
	b, ok := sd.Bytes[key]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchKey, key)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %q from JSON: %w", key, err)
	}
	return nil
}

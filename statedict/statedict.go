package statedict

import (
	"fmt"
	"sort"
)

// StateDict is one rank's flat training state: tensor chunks and opaque byte
// values, each under a dotted key (docs/FORMAT.md, "Keys"). On save
// it is what the rank contributes; on load it is the target the rank wants
// filled, with Data buffers preallocated to the right size.
type StateDict struct {
	Tensors map[string]*Shard
	Bytes   map[string][]byte
}

// New returns an empty StateDict.
func New() *StateDict {
	return &StateDict{Tensors: map[string]*Shard{}, Bytes: map[string][]byte{}}
}

// Keys returns every key (tensors and bytes), sorted.
func (sd *StateDict) Keys() []string {
	out := make([]string, 0, len(sd.Tensors)+len(sd.Bytes))
	for k := range sd.Tensors {
		out = append(out, k)
	}
	for k := range sd.Bytes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Check validates every shard and that no key is both a tensor and bytes.
func (sd *StateDict) Check() error {
	for k, s := range sd.Tensors {
		if err := s.Check(); err != nil {
			return fmt.Errorf("tensor %q: %w", k, err)
		}
		if _, dup := sd.Bytes[k]; dup {
			return fmt.Errorf("key %q is both a tensor and a byte value", k)
		}
	}
	return nil
}

// Clone returns a deep copy (new Data buffers).
func (sd *StateDict) Clone() *StateDict {
	c := New()
	for k, s := range sd.Tensors {
		cp := *s
		cp.Data = append([]byte(nil), s.Data...)
		c.Tensors[k] = &cp
	}
	for k, b := range sd.Bytes {
		c.Bytes[k] = append([]byte(nil), b...)
	}
	return c
}

package statedict

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// ErrBadKey: a state-dict key is empty, holds a NUL byte or is not valid
// UTF-8. Keys are metadata keys (docs/FORMAT.md, "Keys"), so a save
// refuses them before writing anything.
var ErrBadKey = ckpterr.New(ckpterr.Usage, "invalid state-dict key")

// CheckKey returns ErrBadKey, naming k, when k is empty, holds NUL or is
// not valid UTF-8.
func CheckKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: empty key", ErrBadKey)
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrBadKey, k)
	case strings.IndexByte(k, 0) >= 0:
		return fmt.Errorf("%w: key %q holds a NUL byte", ErrBadKey, k)
	}
	return nil
}

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

// Check validates every key (CheckKey) and shard, and that no key is both
// a tensor and bytes.
func (sd *StateDict) Check() error {
	for k := range sd.Bytes {
		if err := CheckKey(k); err != nil {
			return err
		}
	}
	for k, s := range sd.Tensors {
		if err := CheckKey(k); err != nil {
			return err
		}
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

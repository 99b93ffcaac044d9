package metadata

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptkit/ckptkit/ckpterr"

	gojson "github.com/goccy/go-json"
)

// ErrNewerFormat is returned when a checkpoint was written in a newer major
// format version than this reader understands.
var ErrNewerFormat = ckpterr.New(ckpterr.Unsupported, "checkpoint format is newer than this reader")

// ErrInvalid is returned for metadata that does not decode or is
// structurally inconsistent.
var ErrInvalid = ckpterr.New(ckpterr.BadCheckpoint, "invalid checkpoint metadata")

// VersionString is the version this package writes.
func VersionString() string { return fmt.Sprintf("%d.%d", MajorVersion, MinorVersion) }

// Sort puts tensors, bytes and objects in key order (the canonical order).
func (c *Checkpoint) Sort() {
	sort.Slice(c.Tensors, func(i, j int) bool { return c.Tensors[i].Key < c.Tensors[j].Key })
	sort.Slice(c.Bytes, func(i, j int) bool { return c.Bytes[i].Key < c.Bytes[j].Key })
	sort.Slice(c.Objects, func(i, j int) bool { return c.Objects[i].Key < c.Objects[j].Key })
}

// Encode validates c, puts it in canonical order and returns its JSON.
func Encode(c *Checkpoint) ([]byte, error) {
	if c.Format == "" {
		c.Format = FormatName
	}
	if c.Version == "" {
		c.Version = VersionString()
	}
	c.Sort()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := gojson.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	return buf.Bytes(), nil
}

// Decode parses metadata. It refuses input over MaxSize, a newer major
// version (ErrNewerFormat), unknown fields of a version it fully knows, and
// structurally invalid content (ErrInvalid).
func Decode(data []byte) (*Checkpoint, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrInvalid, len(data), MaxSize)
	}
	format, version, err := readHead(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if format != FormatName {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrInvalid, format, FormatName)
	}
	major, minor, err := ParseVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if major > MajorVersion {
		return nil, fmt.Errorf("%w: written as format %s, this reader understands %d.x; upgrade ckptkit", ErrNewerFormat, version, MajorVersion)
	}
	dec := gojson.NewDecoder(bytes.NewReader(data))
	if major == MajorVersion && minor <= MinorVersion {
		dec.DisallowUnknownFields()
	}
	c := new(Checkpoint)
	if err := dec.Decode(c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the metadata object", ErrInvalid)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// readHead returns the "format" and "version" members of the top-level
// object without parsing the rest: it scans tokens and skips other members'
// values, stopping as soon as both are found (Encode writes them first), so
// a huge metadata object is not parsed twice.
func readHead(data []byte) (format, version string, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return "", "", err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", "", errors.New("metadata is not a JSON object")
	}
	var haveFormat, haveVersion bool
	for dec.More() && !(haveFormat && haveVersion) {
		tok, err := dec.Token()
		if err != nil {
			return "", "", err
		}
		key, _ := tok.(string)
		switch key {
		case "format":
			haveFormat = true
			if err := dec.Decode(&format); err != nil {
				return "", "", fmt.Errorf("format: %w", err)
			}
		case "version":
			haveVersion = true
			if err := dec.Decode(&version); err != nil {
				return "", "", fmt.Errorf("version: %w", err)
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", "", err
			}
		}
	}
	return format, version, nil
}

// ParseVersion splits "MAJOR.MINOR".
func ParseVersion(v string) (major, minor int, err error) {
	a, b, ok := strings.Cut(v, ".")
	if !ok {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	if major, err = strconv.Atoi(a); err != nil || major < 0 {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	if minor, err = strconv.Atoi(b); err != nil || minor < 0 {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	return major, minor, nil
}

// elemSizes mirrors statedict's dtype sizes; metadata stays free of other
// packages so any reader can depend on it alone.
var elemSizes = map[string]int64{
	"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
	"int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8,
}

// ElementSize returns the byte size of a dtype name, 0 if unknown.
func ElementSize(dtype string) int64 { return elemSizes[dtype] }

// Validate checks structure: unique sorted keys, known dtypes, chunk ranks
// and bounds, raw chunk lengths, object references and ranges. It does not
// check that chunks tile their tensor (see planner.CheckCoverage), which is
// a resume rule with its own error.
func (c *Checkpoint) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	objects := make(map[string]int64, len(c.Objects))
	for i, o := range c.Objects {
		if o.Key == "" || o.Size < 0 {
			return bad("object %d: empty key or negative size", i)
		}
		if i > 0 && c.Objects[i-1].Key >= o.Key {
			return bad("objects not sorted or duplicated at %q", o.Key)
		}
		objects[o.Key] = o.Size
	}
	// what names the entry lazily: building it per chunk would dominate
	// the validation of a million-chunk checkpoint.
	inObject := func(what func() string, obj string, off, n int64) error {
		size, ok := objects[obj]
		if !ok {
			return bad("%s refers to object %q, which is not listed", what(), obj)
		}
		if off < 0 || n < 0 || off > size || n > size-off { // no off+n: it can overflow
			return bad("%s range [%d,%d) is outside object %q of %d bytes", what(), off, off+n, obj, size)
		}
		return nil
	}
	seen := make(map[string]bool, len(c.Tensors)+len(c.Bytes))
	for i := range c.Tensors {
		t := &c.Tensors[i]
		if t.Key == "" {
			return bad("tensor %d has an empty key", i)
		}
		if i > 0 && c.Tensors[i-1].Key >= t.Key {
			return bad("tensors not sorted or duplicated at %q", t.Key)
		}
		seen[t.Key] = true
		es := ElementSize(t.DType)
		if es == 0 {
			return bad("tensor %q: unknown dtype %q", t.Key, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return bad("tensor %q: negative dimension in shape %v", t.Key, t.Shape)
			}
		}
		for j, ch := range t.Chunks {
			if len(ch.Offsets) != len(t.Shape) || len(ch.Sizes) != len(t.Shape) {
				return bad("tensor %q chunk %d: rank of offsets %v / sizes %v differs from shape %v", t.Key, j, ch.Offsets, ch.Sizes, t.Shape)
			}
			n := int64(1)
			for d := range t.Shape {
				if ch.Offsets[d] < 0 || ch.Sizes[d] < 0 || ch.Offsets[d] > t.Shape[d] || ch.Sizes[d] > t.Shape[d]-ch.Offsets[d] {
					return bad("tensor %q chunk %d: offsets %v sizes %v out of bounds of shape %v", t.Key, j, ch.Offsets, ch.Sizes, t.Shape)
				}
				if ch.Sizes[d] != 0 && n > (1<<62)/ch.Sizes[d] {
					return bad("tensor %q chunk %d: sizes %v overflow", t.Key, j, ch.Sizes)
				}
				n *= ch.Sizes[d]
			}
			if c.Format == FormatName && ch.Encoding != EncodingRaw {
				return bad("tensor %q chunk %d: encoding %q in a native checkpoint (native chunks are raw)", t.Key, j, ch.Encoding)
			}
			if ch.Encoding == EncodingRaw && ch.Length != n*es {
				return bad("tensor %q chunk %d: length %d, want %d for %v of %s", t.Key, j, ch.Length, n*es, ch.Sizes, t.DType)
			}
			if err := inObject(func() string { return fmt.Sprintf("tensor %q chunk %d", t.Key, j) }, ch.Object, ch.Offset, ch.Length); err != nil {
				return err
			}
		}
	}
	for i, b := range c.Bytes {
		if b.Key == "" {
			return bad("bytes entry %d has an empty key", i)
		}
		if i > 0 && c.Bytes[i-1].Key >= b.Key {
			return bad("bytes not sorted or duplicated at %q", b.Key)
		}
		if seen[b.Key] {
			return bad("key %q is both a tensor and a bytes entry", b.Key)
		}
		if c.Format == FormatName && b.Encoding != EncodingRaw {
			return bad("bytes %q: encoding %q in a native checkpoint (native values are raw)", b.Key, b.Encoding)
		}
		if err := inObject(func() string { return fmt.Sprintf("bytes %q", b.Key) }, b.Object, b.Offset, b.Length); err != nil {
			return err
		}
	}
	switch c.Training.Optimizer {
	case OptimizerSaved, OptimizerOmitted, OptimizerNone:
	default:
		return bad("training.optimizer is %q, want %q, %q or %q", c.Training.Optimizer, OptimizerSaved, OptimizerOmitted, OptimizerNone)
	}
	return nil
}

// Tensor returns the entry for key, or nil. It is a binary search over the
// sorted entries.
func (c *Checkpoint) Tensor(key string) *TensorEntry {
	i := sort.Search(len(c.Tensors), func(i int) bool { return c.Tensors[i].Key >= key })
	if i < len(c.Tensors) && c.Tensors[i].Key == key {
		return &c.Tensors[i]
	}
	return nil
}

// BytesValue returns the bytes entry for key, or nil.
func (c *Checkpoint) BytesValue(key string) *BytesEntry {
	i := sort.Search(len(c.Bytes), func(i int) bool { return c.Bytes[i].Key >= key })
	if i < len(c.Bytes) && c.Bytes[i].Key == key {
		return &c.Bytes[i]
	}
	return nil
}

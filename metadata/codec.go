package metadata

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/keys"
	"github.com/ckptkit/ckptkit/statedict"
)

// ErrNewerFormat is returned when a checkpoint was written in a newer major
// format version than this reader understands.
var ErrNewerFormat = ckpterr.New(ckpterr.Unsupported, "checkpoint format is newer than this reader")

// ErrInvalid is returned for metadata that does not decode, breaks a rule
// of docs/FORMAT.md or is structurally inconsistent.
var ErrInvalid = ckpterr.New(ckpterr.BadCheckpoint, "invalid checkpoint metadata")

// VersionString is the version this package writes.
func VersionString() string { return fmt.Sprintf("%d.%d", MajorVersion, MinorVersion) }

// Sort puts tensors, bytes and objects in key order (the canonical order).
func (c *Checkpoint) Sort() {
	sort.Slice(c.Tensors, func(i, j int) bool { return c.Tensors[i].Key < c.Tensors[j].Key })
	sort.Slice(c.Bytes, func(i, j int) bool { return c.Bytes[i].Key < c.Bytes[j].Key })
	sort.Slice(c.Objects, func(i, j int) bool { return c.Objects[i].Key < c.Objects[j].Key })
}

// Encode validates c (as Decode will: world_size >= 1 included), puts it in
// canonical order, writes [] for nil slices and returns its JSON.
func Encode(c *Checkpoint) ([]byte, error) {
	if c.Format == "" {
		c.Format = FormatName
	}
	if c.Version == "" {
		c.Version = VersionString()
	}
	c.Sort()
	c.emptyArrays()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.WorldSize < 1 {
		return nil, fmt.Errorf("%w: $.world_size is %d, want at least 1", ErrInvalid, c.WorldSize)
	}
	unsealed := *c
	unsealed.MetadataCRC32C = 0 // omitted: Seal appends the member
	out, err := encodeJSON(&unsealed)
	if err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	major, minor, err := ParseVersion(c.Version)
	if err != nil || major != MajorVersion || minor < SealMinorVersion {
		return out, nil // an older version, written as it was
	}
	return sealEncoded(out), nil
}

// emptyArrays replaces nil slices with empty ones, so that Encode writes []
// and never null for an array.
func (c *Checkpoint) emptyArrays() {
	orEmpty := func(s []int64) []int64 {
		if s == nil {
			return []int64{}
		}
		return s
	}
	if c.Tensors == nil {
		c.Tensors = []TensorEntry{}
	}
	if c.Bytes == nil {
		c.Bytes = []BytesEntry{}
	}
	if c.Objects == nil {
		c.Objects = []ObjectEntry{}
	}
	for i := range c.Tensors {
		t := &c.Tensors[i]
		t.Shape = orEmpty(t.Shape)
		if t.Chunks == nil {
			t.Chunks = []Chunk{}
		}
		for j := range t.Chunks {
			t.Chunks[j].Offsets = orEmpty(t.Chunks[j].Offsets)
			t.Chunks[j].Sizes = orEmpty(t.Chunks[j].Sizes)
		}
	}
}

// Decode parses metadata. It refuses input over MaxSize, a newer major
// version (ErrNewerFormat), and (ErrInvalid, naming the JSON path or key)
// everything docs/FORMAT.md forbids: a version below 1.0, a member name
// that differs from a known one only in case, a duplicate member in any
// object, a missing required member, null where no array is, invalid UTF-8,
// unknown members in a version it fully knows, and structurally invalid
// content (see Validate). Equal short shapes, offsets and sizes of
// different entries may share one backing array: the decoded value's
// slices are read-only.
func Decode(data []byte) (*Checkpoint, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrInvalid, len(data), MaxSize)
	}
	if bytes.HasPrefix(data, []byte("\ufeff")) {
		return nil, fmt.Errorf("%w: the metadata starts with a byte order mark", ErrInvalid)
	}
	format, version, err := readHead(data)
	if err != nil {
		return nil, err
	}
	if format != FormatName {
		return nil, fmt.Errorf("%w: $.format is %q, want %q", ErrInvalid, format, FormatName)
	}
	major, minor, err := ParseVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: $.version: %v", ErrInvalid, err)
	}
	if major > MajorVersion {
		return nil, fmt.Errorf("%w: written as format %s, this reader understands %d.x; upgrade ckptkit", ErrNewerFormat, version, MajorVersion)
	}
	if major < 1 {
		return nil, fmt.Errorf("%w: $.version %q is below 1.0, which no ckptkit release wrote", ErrInvalid, version)
	}
	// The seal is checked before anything else is decoded: a flipped bit
	// must not reach the decoder as a plausible value. Documents of 1.1 on
	// must carry it; 1.0 ones are read without it, but are checked when
	// they have one.
	sealed, err := checkSeal(data)
	if err != nil {
		return nil, err
	}
	if !sealed && (major > 1 || minor >= SealMinorVersion) {
		return nil, fmt.Errorf("%w: $.%s is missing: format %s documents carry the CRC32C of their body as their last member", ErrInvalid, SealMember, version)
	}
	// One pass decodes and enforces the strict rules; unknown members are
	// refused in a version this reader fully knows, skipped otherwise.
	known := major == MajorVersion && minor <= MinorVersion
	c, err := decodeDoc(data, known)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.WorldSize < 1 {
		return nil, fmt.Errorf("%w: $.world_size is %d, want at least 1", ErrInvalid, c.WorldSize)
	}
	if !sealed && c.MetadataCRC32C != 0 {
		return nil, fmt.Errorf("%w: $.%s is not written as the document's last member", ErrInvalid, SealMember)
	}
	return c, nil
}

// ParseVersion splits "MAJOR.MINOR": two decimal numbers without sign or
// leading zeros.
func ParseVersion(v string) (major, minor int, err error) {
	a, b, ok := strings.Cut(v, ".")
	if !ok || !decimal(a) || !decimal(b) {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	if major, err = strconv.Atoi(a); err != nil {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	if minor, err = strconv.Atoi(b); err != nil {
		return 0, 0, fmt.Errorf("version %q is not MAJOR.MINOR", v)
	}
	return major, minor, nil
}

// decimal reports whether s is a canonical decimal number: digits only, no
// leading zero unless it is "0".
func decimal(s string) bool {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ElementSize returns the byte size of a dtype name, 0 if unknown. The
// sizes are statedict's table, the only one.
func ElementSize(dtype string) int64 { return int64(statedict.DType(dtype).Size()) }

// Validate checks structure: unique keys in bytewise order, valid UTF-8
// keys, object keys that keys.Validate accepts, known dtypes,
// non-negative integers, shapes whose byte size fits an int64, chunk ranks
// and bounds, raw chunk lengths, object references and ranges. Errors
// match ErrInvalid and name the JSON path ("$.tensors[3].chunks[1]") and the
// key. It does not check that chunks tile their tensor (see
// planner.CheckCoverage), which is a resume rule with its own error.
func (c *Checkpoint) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if c.WorldSize < 0 || c.Training.Iteration < 0 || c.Training.OptimizerStateEntries < 0 {
		return bad("$.world_size %d, $.training.iteration %d and $.training.optimizer_state_entries %d must not be negative",
			c.WorldSize, c.Training.Iteration, c.Training.OptimizerStateEntries)
	}
	objects := make(map[string]int64, len(c.Objects))
	for i, o := range c.Objects {
		if err := keys.Validate(o.Key); err != nil {
			return bad("$.objects[%d].key: %v", i, err)
		}
		if o.Key == ObjectKey {
			return bad("$.objects[%d].key: %q is the metadata object, not a data object", i, o.Key)
		}
		if o.Size < 0 {
			return bad("$.objects[%d].size of %q is negative (%d)", i, o.Key, o.Size)
		}
		if i > 0 && c.Objects[i-1].Key >= o.Key {
			return bad("$.objects[%d].key: objects not sorted or duplicated at %q", i, o.Key)
		}
		objects[o.Key] = o.Size
	}
	// what names the entry lazily: building it per chunk would dominate
	// the validation of a million-chunk checkpoint.
	inObject := func(what func() string, obj string, off, n int64) error {
		size, ok := objects[obj]
		if !ok {
			if err := keys.Validate(obj); err != nil {
				return bad("%s.object: %v", what(), err)
			}
			return bad("%s refers to object %q, which is not listed", what(), obj)
		}
		if off < 0 || n < 0 {
			return bad("%s: negative offset %d or length %d", what(), off, n)
		}
		if off > size || n > size-off { // no off+n: it can overflow
			return bad("%s range [%d,%d) is outside object %q of %d bytes", what(), off, off+n, obj, size)
		}
		return nil
	}
	key := func(what string, i int, k string) error {
		if k == "" {
			return bad("$.%s[%d].key is empty", what, i)
		}
		if !utf8.ValidString(k) {
			return bad("$.%s[%d].key %q is not valid UTF-8", what, i, k)
		}
		return nil
	}
	for i := range c.Tensors {
		t := &c.Tensors[i]
		if err := key("tensors", i, t.Key); err != nil {
			return err
		}
		if i > 0 && c.Tensors[i-1].Key >= t.Key {
			return bad("$.tensors[%d].key: tensors not sorted or duplicated at %q", i, t.Key)
		}
		es := ElementSize(t.DType)
		if es == 0 {
			return bad("$.tensors[%d] (%q): unknown dtype %q", i, t.Key, t.DType)
		}
		// The whole tensor's byte size must be an int64: a larger shape
		// could never be read, and its size would wrap around (a float32
		// [2^62] would claim 0 bytes).
		if slices.Contains(t.Shape, 0) {
			for _, d := range t.Shape {
				if d < 0 {
					return bad("$.tensors[%d] (%q): negative dimension in shape %v", i, t.Key, t.Shape)
				}
			}
		} else {
			total := es
			for _, d := range t.Shape {
				if d < 0 {
					return bad("$.tensors[%d] (%q): negative dimension in shape %v", i, t.Key, t.Shape)
				}
				if total > math.MaxInt64/d {
					return bad("$.tensors[%d] (%q): shape %v of %s is over 2^63-1 bytes", i, t.Key, t.Shape, t.DType)
				}
				total *= d
			}
		}
		for j := range t.Chunks {
			ch := &t.Chunks[j]
			where := func() string { return fmt.Sprintf("$.tensors[%d].chunks[%d] (%q)", i, j, t.Key) }
			if len(ch.Offsets) != len(t.Shape) || len(ch.Sizes) != len(t.Shape) {
				return bad("%s: rank of offsets %v / sizes %v differs from shape %v", where(), ch.Offsets, ch.Sizes, t.Shape)
			}
			n, empty := int64(1), false
			for d := range t.Shape {
				if ch.Offsets[d] < 0 || ch.Sizes[d] < 0 || ch.Offsets[d] > t.Shape[d] || ch.Sizes[d] > t.Shape[d]-ch.Offsets[d] {
					return bad("%s: offsets %v sizes %v out of bounds of shape %v", where(), ch.Offsets, ch.Sizes, t.Shape)
				}
				// No overflow: with no zero size, every dimension of the
				// shape is non-zero too, and its product fits.
				empty = empty || ch.Sizes[d] == 0
				if !empty {
					n *= ch.Sizes[d]
				}
			}
			if empty {
				n = 0
			}
			if c.Format == FormatName && ch.Encoding != EncodingRaw {
				return bad("%s: encoding %q in a native checkpoint (native chunks are raw)", where(), ch.Encoding)
			}
			if ch.Encoding == EncodingRaw && ch.Length != n*es {
				return bad("%s: length %d, want %d for %v of %s", where(), ch.Length, n*es, ch.Sizes, t.DType)
			}
			if err := inObject(where, ch.Object, ch.Offset, ch.Length); err != nil {
				return err
			}
		}
	}
	for i := range c.Bytes {
		b := &c.Bytes[i]
		if err := key("bytes", i, b.Key); err != nil {
			return err
		}
		if i > 0 && c.Bytes[i-1].Key >= b.Key {
			return bad("$.bytes[%d].key: bytes not sorted or duplicated at %q", i, b.Key)
		}
		if c.Tensor(b.Key) != nil { // tensors are sorted: a binary search
			return bad("$.bytes[%d].key: %q is both a tensor and a bytes entry", i, b.Key)
		}
		where := func() string { return fmt.Sprintf("$.bytes[%d] (%q)", i, b.Key) }
		if c.Format == FormatName && b.Encoding != EncodingRaw {
			return bad("%s: encoding %q in a native checkpoint (native values are raw)", where(), b.Encoding)
		}
		if err := inObject(where, b.Object, b.Offset, b.Length); err != nil {
			return err
		}
	}
	for i, p := range c.Training.Params {
		if p == "" || !utf8.ValidString(p) {
			return bad("$.training.params[%d] %q is empty or not valid UTF-8", i, p)
		}
		if i > 0 && c.Training.Params[i-1] >= p {
			return bad("$.training.params[%d]: params not sorted or duplicated at %q", i, p)
		}
	}
	if err := c.Training.CheckCensus(); err != nil {
		return err
	}
	switch c.Training.Optimizer {
	case OptimizerSaved, OptimizerOmitted, OptimizerNone:
	default:
		return bad("$.training.optimizer is %q, want %q, %q or %q", c.Training.Optimizer, OptimizerSaved, OptimizerOmitted, OptimizerNone)
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

// CheckCensus checks the slot census (training.slot_sets and
// training.param_slots): one index per recorded parameter, each -1 or a
// set's index; each set non-empty, sorted bytewise, distinct names. The
// error matches ErrInvalid and names the JSON path.
func (t *TrainingState) CheckCensus() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if len(t.SlotSets) == 0 && len(t.ParamSlots) == 0 {
		return nil
	}
	if len(t.ParamSlots) != len(t.Params) {
		return bad("$.training.param_slots has %d entries for %d params (one per entry of $.training.params)", len(t.ParamSlots), len(t.Params))
	}
	for i, set := range t.SlotSets {
		if len(set) == 0 {
			return bad("$.training.slot_sets[%d] is empty (a parameter without state has param_slots -1)", i)
		}
		for j, s := range set {
			if s == "" || !utf8.ValidString(s) {
				return bad("$.training.slot_sets[%d][%d] %q is empty or not valid UTF-8", i, j, s)
			}
			if j > 0 && set[j-1] >= s {
				return bad("$.training.slot_sets[%d][%d]: slots not sorted or duplicated at %q", i, j, s)
			}
		}
	}
	for i, j := range t.ParamSlots {
		if j < -1 || j >= len(t.SlotSets) {
			return bad("$.training.param_slots[%d] is %d, want -1 or an index of $.training.slot_sets (%d sets)", i, j, len(t.SlotSets))
		}
	}
	return nil
}

package metadata

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// The decoder: one pass over the metadata bytes that enforces the strict
// rules (strict.go) while it fills the Checkpoint, so a document is read
// once, and that bounds what it allocates by what the document holds:
//
//   - shapes, offsets and sizes are carved from shared blocks of int64,
//     short strings (keys) from shared blocks of bytes, so a million chunks
//     cost a few thousand allocations, not millions;
//   - object names, dtypes and encodings, repeated in every chunk, are
//     interned: each distinct name is stored once;
//   - a long array (tensors, a tensor's chunks, ...) is allocated at its
//     exact length once it is known to be long (its elements counted ahead,
//     at most one per minimal encoded element in the bytes that remain),
//     not grown by repeated copies;
//   - a long string (a 500 MB "writer") costs one copy of its bytes.
//
// Peak memory is the input plus the decoded value: no second copy of the
// document, no intermediate tree of values.

// Member indices of the schemas, in the order of the struct fields; init
// checks them against the schemas derived from the struct tags, so a field
// added to a type fails at start-up until the decoder handles it.
const (
	topFormat = iota
	topVersion
	topWriter
	topCreatedAt
	topWorldSize
	topTensors
	topBytes
	topObjects
	topTraining
	topSeal
)

const (
	tensorKey = iota
	tensorDType
	tensorShape
	tensorChunks
)

const (
	chunkOffsets = iota
	chunkSizes
	chunkObject
	chunkOffset
	chunkLength
	chunkCRC
	chunkEncoding
)

const (
	bytesKey = iota
	bytesObject
	bytesOffset
	bytesLength
	bytesCRC
	bytesEncoding
)

const (
	objectKey = iota
	objectSize
)

const (
	trainIteration = iota
	trainOptimizer
	trainOptimizerPrefix
	trainOptimizerSlots
	trainOptimizerStateEntries
	trainSchedulerPrefix
	trainModelPrefix
	trainParams
	trainSlotSets
	trainParamSlots
)

var (
	tensorSchema   = topSchema.members[topTensors].obj
	chunkSchema    = tensorSchema.members[tensorChunks].obj
	bytesSchema    = topSchema.members[topBytes].obj
	objectSchema   = topSchema.members[topObjects].obj
	trainingSchema = topSchema.members[topTraining].obj
	// headSchema finds format and version (readHead).
	headSchema = &schema{what: "metadata", members: topSchema.members[topFormat : topVersion+1]}
)

func init() {
	for _, c := range []struct {
		sc    *schema
		names []string
	}{
		{topSchema, []string{"format", "version", "writer", "created_at", "world_size", "tensors", "bytes", "objects", "training", SealMember}},
		{tensorSchema, []string{"key", "dtype", "shape", "chunks"}},
		{chunkSchema, []string{"offsets", "sizes", "object", "offset", "length", "crc32c", "encoding"}},
		{bytesSchema, []string{"key", "object", "offset", "length", "crc32c", "encoding"}},
		{objectSchema, []string{"key", "size"}},
		{trainingSchema, []string{"iteration", "optimizer", "optimizer_prefix", "optimizer_slots", "optimizer_state_entries", "scheduler_prefix", "model_prefix", "params", "slot_sets", "param_slots"}},
	} {
		var got []string
		for _, m := range c.sc.members {
			got = append(got, m.name)
		}
		if !slices.Equal(got, c.names) {
			panic(fmt.Sprintf("metadata: the decoder of %s decodes %v, the type has %v", c.sc.what, c.names, got))
		}
	}
}

// Smallest encodings of an array element (with its comma), used to bound
// an allocation by the bytes that remain: a chunk needs at least
// {"offsets":[],"sizes":[],"object":"","offset":0,"length":0,"crc32c":0}.
const (
	minChunkBytes  = 71
	minTensorBytes = 45 // {"key":"","dtype":"","shape":[],"chunks":[]},
	minBytesBytes  = 55
	minObjectBytes = 20
	minStringBytes = 3
	minArrayBytes  = 3 // [],
	minIntBytes    = 2 // 0,
	// countAfterBytes is the size from which an array's remaining
	// elements are counted ahead (below it, append's growth is cheap).
	countAfterBytes = 16 << 20
	// internMax bounds the interned names of one document.
	internMax = 4096
	// intBlock and strBlock are the sizes of the shared blocks.
	intBlock = 8192
	strBlock = 64 << 10
)

// decoder is the state of one Decode.
type decoder struct {
	strictScan
	ints    arrayPool[int64] // shapes, offsets and sizes
	recent  [3][4][]int64    // per role, the last distinct short integer arrays
	nextIdx [3]int
	strs    []byte // the block short strings are copied into
	intern  map[string]string
	chunks  arrayPool[Chunk]
}

func newDecoder(data []byte, strict bool) *decoder {
	return &decoder{strictScan: strictScan{data: data, strict: strict, path: make([]pathElem, 0, 8)},
		chunks: arrayPool[Chunk]{size: 4096}, ints: arrayPool[int64]{size: intBlock}}
}

// decodeDoc decodes data, a whole metadata document, enforcing the strict
// rules; strict refuses unknown members.
func decodeDoc(data []byte, strict bool) (*Checkpoint, error) {
	// Outside strings only ASCII is valid JSON, so one check of the whole
	// document is the check of every string.
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: the metadata is not valid UTF-8 (at byte %d)", ErrInvalid, firstInvalidUTF8(data))
	}
	d := newDecoder(data, strict)
	d.intern = make(map[string]string)
	d.ws()
	if d.pos >= len(d.data) || d.data[d.pos] != '{' {
		return nil, d.errorf("the metadata is not a JSON object")
	}
	c := new(Checkpoint)
	if err := d.checkpoint(c); err != nil {
		return nil, err
	}
	d.ws()
	if d.pos != len(d.data) {
		return nil, d.errorf("trailing data after the metadata object")
	}
	return c, nil
}

// readHead returns the "format" and "version" members of the top-level
// object without decoding the rest: other members are skipped (and
// checked) without allocating, and the scan stops once both are found
// (Encode writes them first). Its errors match ErrInvalid.
func readHead(data []byte) (format, version string, err error) {
	d := newDecoder(data, false)
	d.ws()
	if d.pos >= len(d.data) || d.data[d.pos] != '{' {
		return "", "", d.errorf("the metadata is not a JSON object")
	}
	it := d.open(headSchema, 0)
	var have int
	for have < 2 {
		i, err := d.member(&it)
		switch {
		case err != nil:
			return "", "", err
		case i < 0:
			return format, version, nil
		case i == topFormat:
			format, err = d.string()
		default:
			version, err = d.string()
		}
		if err != nil {
			return "", "", err
		}
		have++
	}
	return format, version, nil
}

// decodeObject decodes the object at s.pos with schema sc into v, field
// decoding the value of each of its members by index.
func decodeObject[T any](d *decoder, sc *schema, depth int, v *T, field func(*decoder, *T, int) error) error {
	if err := d.objectStart(); err != nil {
		return err
	}
	it := d.open(sc, depth)
	for {
		i, err := d.member(&it)
		if err != nil || i < 0 {
			return err
		}
		if err := field(d, v, i); err != nil {
			return err
		}
	}
}

func (d *decoder) checkpoint(c *Checkpoint) error {
	return decodeObject(d, topSchema, 0, c, checkpointField)
}

func checkpointField(d *decoder, c *Checkpoint, i int) (err error) {
	switch i {
	case topFormat:
		c.Format, err = d.string()
	case topVersion:
		c.Version, err = d.string()
	case topWriter:
		c.Writer, err = d.string()
	case topCreatedAt:
		err = d.time(&c.CreatedAt)
	case topWorldSize:
		c.WorldSize, err = d.int()
	case topTensors:
		c.Tensors, err = decodeArray(d, minTensorBytes, (*decoder).tensor, nil, d.tensorsHint())
	case topBytes:
		c.Bytes, err = decodeArray(d, minBytesBytes, (*decoder).bytesEntry, nil, 0)
	case topObjects:
		c.Objects, err = decodeArray(d, minObjectBytes, (*decoder).object, nil, 0)
	case topTraining:
		err = decodeObject(d, trainingSchema, 1, &c.Training, trainingField)
	case topSeal:
		c.MetadataCRC32C, err = d.uint32()
	}
	return err
}

func (d *decoder) tensor(t *TensorEntry) error {
	return decodeObject(d, tensorSchema, 1, t, tensorField)
}

func tensorField(d *decoder, t *TensorEntry, i int) (err error) {
	switch i {
	case tensorKey:
		t.Key, err = d.string()
	case tensorDType:
		t.DType, err = d.internedString()
	case tensorShape:
		t.Shape, err = d.intArray(roleShape)
	case tensorChunks:
		t.Chunks, err = decodeArray(d, minChunkBytes, (*decoder).chunk, &d.chunks, 0)
	}
	return err
}

func (d *decoder) chunk(ch *Chunk) error {
	return decodeObject(d, chunkSchema, 2, ch, chunkField)
}

func chunkField(d *decoder, ch *Chunk, i int) (err error) {
	switch i {
	case chunkOffsets:
		ch.Offsets, err = d.intArray(roleOffsets)
	case chunkSizes:
		ch.Sizes, err = d.intArray(roleSizes)
	default:
		err = placeField(d, i-chunkObject, &ch.Object, &ch.Offset, &ch.Length, &ch.CRC32C, &ch.Encoding)
	}
	return err
}

func (d *decoder) bytesEntry(b *BytesEntry) error {
	return decodeObject(d, bytesSchema, 1, b, bytesField)
}

func bytesField(d *decoder, b *BytesEntry, i int) (err error) {
	if i == bytesKey {
		b.Key, err = d.string()
		return err
	}
	return placeField(d, i-bytesObject, &b.Object, &b.Offset, &b.Length, &b.CRC32C, &b.Encoding)
}

// placeField decodes member k of where an item's bytes are stored, the
// members chunks and bytes entries share in this order: object, offset,
// length, crc32c, encoding.
func placeField(d *decoder, k int, object *string, offset, length *int64, crc *uint32, encoding *string) (err error) {
	switch k {
	case 0:
		*object, err = d.internedString()
	case 1:
		*offset, err = d.int64()
	case 2:
		*length, err = d.int64()
	case 3:
		*crc, err = d.uint32()
	case 4:
		*encoding, err = d.internedString()
	}
	return err
}

func (d *decoder) object(o *ObjectEntry) error {
	return decodeObject(d, objectSchema, 1, o, objectField)
}

func objectField(d *decoder, o *ObjectEntry, i int) (err error) {
	switch i {
	case objectKey:
		o.Key, err = d.internedString()
	case objectSize:
		o.Size, err = d.int64()
	}
	return err
}

func trainingField(d *decoder, t *TrainingState, i int) (err error) {
	switch i {
	case trainIteration:
		t.Iteration, err = d.int64()
	case trainOptimizer:
		t.Optimizer, err = d.string()
	case trainOptimizerPrefix:
		t.OptimizerPrefix, err = d.string()
	case trainOptimizerSlots:
		t.OptimizerSlots, err = decodeArray(d, minStringBytes, stringElem, nil, 0)
	case trainOptimizerStateEntries:
		t.OptimizerStateEntries, err = d.int()
	case trainSchedulerPrefix:
		t.SchedulerPrefix, err = d.string()
	case trainModelPrefix:
		t.ModelPrefix, err = d.string()
	case trainParams:
		t.Params, err = decodeArray(d, minStringBytes, stringElem, nil, 0)
	case trainSlotSets:
		t.SlotSets, err = decodeArray(d, minArrayBytes, func(d *decoder, set *[]string) (err error) {
			*set, err = decodeArray(d, minStringBytes, stringElem, nil, 0)
			return err
		}, nil, 0)
	case trainParamSlots:
		t.ParamSlots, err = decodeArray(d, minIntBytes, func(d *decoder, n *int) (err error) {
			*n, err = d.int()
			return err
		}, nil, 0)
	}
	return err
}

func stringElem(d *decoder, s *string) (err error) {
	*s, err = d.string()
	return err
}

// decodeArray decodes an array (null: nil) whose elements elem decodes.
// minBytes is the smallest encoding of an element, which bounds the
// allocation for the elements counted ahead. With a pool, a short array is
// decoded in place at the tail of the pool's shared block; without one,
// capHint (when > 0) is the capacity to start with.
func decodeArray[T any](d *decoder, minBytes int, elem func(*decoder, *T) error, pool *arrayPool[T], capHint int) ([]T, error) {
	if null, err := d.arrayStart(); err != nil || null {
		return nil, err
	}
	var out []T
	if capHint > 0 {
		out = make([]T, 0, capHint)
	}
	inBlock := pool != nil
	if inBlock {
		if cap(pool.block) == 0 {
			pool.block = make([]T, 0, pool.size)
		}
		out = pool.block[len(pool.block):len(pool.block)]
	}
	var a arrIter
	for {
		more, err := d.elem(&a)
		if err != nil {
			return nil, err
		}
		if !more {
			break
		}
		if len(out) == cap(out) {
			out = growArray(d, out, minBytes, pool, &inBlock)
		}
		var zero T
		out = append(out, zero)
		if err := elem(d, &out[len(out)-1]); err != nil {
			return nil, err
		}
	}
	if inBlock {
		pool.block = pool.block[:len(pool.block)+len(out)]
		return out[:len(out):len(out)], nil
	}
	if out == nil {
		out = []T{}
	}
	return out, nil
}

// growArray makes room for at least one more element in out: a fresh block
// for a short array of a pool, else its own array, allocated at its exact
// length once it is long (countAhead), doubled before.
func growArray[T any](d *decoder, out []T, minBytes int, pool *arrayPool[T], inBlock *bool) []T {
	if *inBlock {
		if len(out) < pool.size/4 {
			nb := make([]T, len(out), pool.size)
			copy(nb, out)
			pool.block = nb[:0]
			return nb
		}
		// Too long for the block: its own array, at its counted length.
		*inBlock = false
		own := make([]T, len(out), len(out)+max(1, d.countAhead(minBytes)))
		copy(own, out)
		return own
	}
	var zero T
	if len(out)*int(unsafe.Sizeof(zero)) >= countAfterBytes {
		return slices.Grow(out, max(1, d.countAhead(minBytes)))
	}
	return slices.Grow(out, max(1, len(out))) // doubling: append's 1.25x would allocate 5x the array in all

}

// arrayPool is the shared block of one kind of short array.
type arrayPool[T any] struct {
	block []T
	size  int // elements per block
}

// tensorsHint returns the capacity to decode the tensors array with, for
// a long document: the "dtype" members that follow (every tensor has one,
// and the byte sequence cannot occur inside a string, whose quotes are
// escaped), at most one per minimal tensor encoding of what follows; 0
// for a short document. A hint that is off (escaped member names, unknown
// members of a newer minor) only costs growth or spare capacity.
func (d *decoder) tensorsHint() int {
	rest := d.data[d.pos:]
	if len(rest) < 1<<20 {
		return 0
	}
	return min(bytes.Count(rest, dtypeMember), len(rest)/minTensorBytes+1)
}

// dtypeMember is how a tensor's dtype member starts.
var dtypeMember = []byte(`"dtype":`)

// countAhead returns how many elements the array being decoded has from
// s.pos on, bounded by one per minBytes of what remains: a count of the
// top-level commas up to the closing bracket, strings skipped. Invalid
// JSON ends the count early; the decoder then refuses it.
func (d *decoder) countAhead(minBytes int) int {
	data, depth, n := d.data, 0, 1
	i := d.pos
	for ; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
		case ']', '}':
			if depth == 0 {
				return min(n, (i-d.pos)/minBytes+1)
			}
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
	return min(n, (i-d.pos)/minBytes+1)
}

// arrIter is the state of one array being decoded by elem.
type arrIter struct {
	idx     int
	started bool
}

// arrayStart consumes null (reporting true) or the opening bracket of an
// array.
func (d *decoder) arrayStart() (null bool, err error) {
	d.ws()
	if d.pos+4 <= len(d.data) && string(d.data[d.pos:d.pos+4]) == "null" {
		d.pos += 4 // null is an empty array (FORMAT.md)
		return true, nil
	}
	if d.pos >= len(d.data) || d.data[d.pos] != '[' {
		return false, d.errorf("want an array, found %s", d.token())
	}
	d.pos++
	return false, nil
}

// elem advances to the next element of an array, reporting false after
// the closing bracket.
func (d *decoder) elem(a *arrIter) (bool, error) {
	if !a.started {
		a.started = true
		d.ws()
		if d.pos < len(d.data) && d.data[d.pos] == ']' {
			d.pos++
			return false, nil
		}
		d.path = append(d.path, pathElem{})
		return true, nil
	}
	more, err := d.next(']')
	if err != nil {
		return false, err
	}
	if !more {
		d.path = d.path[:len(d.path)-1]
		return false, nil
	}
	a.idx++
	d.path[len(d.path)-1].index = a.idx
	return true, nil
}

// Roles of integer arrays, each with its own cache of recent values.
const (
	roleShape = iota
	roleOffsets
	roleSizes
)

// intArray decodes an array of integers. A short one equal to one of the
// last few of its role (the shape every tensor of a model repeats, the
// sizes of equal shards) is that array: entries share it, read-only.
func (d *decoder) intArray(role int) ([]int64, error) {
	v, err := decodeArray(d, 2, int64Elem, &d.ints, 0)
	if err != nil || v == nil || len(v) > 4 {
		return v, err
	}
	rec := &d.recent[role]
	for _, r := range rec {
		if r != nil && slices.Equal(r, v) {
			// v was decoded at the tail of the block: give its space back.
			if n := len(d.ints.block); len(v) > 0 && n >= len(v) && &d.ints.block[n-len(v)] == &v[0] {
				d.ints.block = d.ints.block[:n-len(v)]
			}
			return r, nil
		}
	}
	rec[d.nextIdx[role]] = v
	d.nextIdx[role] = (d.nextIdx[role] + 1) % len(rec)
	return v, nil
}

func int64Elem(d *decoder, v *int64) (err error) {
	*v, err = d.int64()
	return err
}

// objectStart checks that an object starts at s.pos.
func (d *decoder) objectStart() error {
	d.ws()
	if d.pos >= len(d.data) {
		return d.errorf("unexpected end of the metadata")
	}
	if d.data[d.pos] != '{' {
		return d.errorf("want an object, found %s", d.token())
	}
	return nil
}

// rawString consumes a string value and returns its raw content.
func (d *decoder) rawString() (raw []byte, escaped bool, err error) {
	d.ws()
	if d.pos >= len(d.data) {
		return nil, false, d.errorf("unexpected end of the metadata")
	}
	if d.data[d.pos] != '"' {
		return nil, false, d.errorf("want a string, found %s", d.token())
	}
	return d.str()
}

// string decodes a string value.
func (d *decoder) string() (string, error) {
	raw, escaped, err := d.rawString()
	if err != nil {
		return "", err
	}
	if escaped {
		return d.unescape(raw)
	}
	return d.copyString(raw), nil
}

// internedString decodes a string value that repeats (an object name, a
// dtype, an encoding): each distinct value is stored once.
func (d *decoder) internedString() (string, error) {
	raw, escaped, err := d.rawString()
	if err != nil {
		return "", err
	}
	if escaped {
		return d.unescape(raw)
	}
	if s, ok := d.intern[string(raw)]; ok {
		return s, nil
	}
	s := d.copyString(raw)
	if len(d.intern) < internMax {
		d.intern[s] = s
	}
	return s, nil
}

// copyString returns raw as a string: short ones share a block (never
// written again once a string points into it), long ones are one
// allocation each.
func (d *decoder) copyString(raw []byte) string {
	n := len(raw)
	switch {
	case n == 0:
		return ""
	case n > strBlock/16:
		return string(raw)
	}
	if cap(d.strs)-len(d.strs) < n {
		d.strs = make([]byte, 0, strBlock)
	}
	d.strs = append(d.strs, raw...)
	return unsafe.String(&d.strs[len(d.strs)-n], n)
}

// unescape decodes the content of a string with escapes (str has checked
// its surrogate escapes).
func (s *strictScan) unescape(raw []byte) (string, error) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", s.errorf("a string ends in a backslash")
		}
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw[i+1:])
			if !ok {
				return "", s.errorf("bad \\u escape in a string")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				lo, ok := rune(0), false
				if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					lo, ok = hex4(raw[i+3:])
				}
				if !ok || r > 0xDBFF || lo < 0xDC00 || lo > 0xDFFF {
					return "", s.errorf("lone surrogate \\u%04x in a string", r)
				}
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", s.errorf("invalid escape \\%c in a string", raw[i])
		}
	}
	if len(out) == 0 {
		return "", nil
	}
	return unsafe.String(&out[0], len(out)), nil
}

// time decodes an RFC 3339 time, as time.Time's JSON decoding does.
func (d *decoder) time(t *time.Time) error {
	d.ws()
	start := d.pos
	if _, _, err := d.rawString(); err != nil {
		return err
	}
	if err := t.UnmarshalJSON(d.data[start:d.pos]); err != nil {
		return d.errorf("%v", err)
	}
	return nil
}

// int64 decodes an integer: an optional minus sign and decimal digits
// without leading zeros, no fraction or exponent, within int64.
func (d *decoder) int64() (int64, error) {
	d.ws()
	data := d.data
	if d.pos >= len(data) {
		return 0, d.errorf("unexpected end of the metadata")
	}
	c := data[d.pos]
	if c != '-' && (c < '0' || c > '9') {
		return 0, d.errorf("want an integer, found %s", d.token())
	}
	i, neg := d.pos, c == '-'
	if neg {
		i++
	}
	var v uint64
	digits := i
	for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
		dg := uint64(data[i] - '0')
		if v > (math.MaxUint64-dg)/10 {
			return 0, d.errorf("integer %s is out of range", d.token())
		}
		v = v*10 + dg
	}
	switch {
	case i == digits || (data[digits] == '0' && i-digits > 1) || (i < len(data) && numberByte[data[i]]):
		return 0, d.errorf("want an integer, found %s", d.token())
	case !neg && v > math.MaxInt64, neg && v > 1<<63:
		return 0, d.errorf("integer %s is out of range", d.token())
	}
	d.pos = i
	if neg {
		return int64(-v), nil
	}
	return int64(v), nil
}

// int decodes an integer within int.
func (d *decoder) int() (int, error) {
	v, err := d.int64()
	if err == nil && strconv.IntSize == 32 && (v < math.MinInt32 || v > math.MaxInt32) {
		err = d.errorf("integer %d is out of range", v)
	}
	return int(v), err
}

// uint32 decodes an integer within 0..2^32-1.
func (d *decoder) uint32() (uint32, error) {
	v, err := d.int64()
	if err == nil && (v < 0 || v > math.MaxUint32) {
		err = d.errorf("integer %d is outside 0..2^32-1", v)
	}
	return uint32(v), err
}

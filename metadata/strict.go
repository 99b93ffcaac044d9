package metadata

import (
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The strict rules, enforced by the decoder (decode.go) as it decodes, in
// one pass over the metadata bytes: member names matched exactly (general
// JSON libraries fold case), no duplicate member in any object (they keep
// the last), every required member present, null only where an array may
// be empty, strings of valid UTF-8 without raw control characters or lone
// surrogate escapes (libraries replace them with U+FFFD), integers without
// fraction, exponent, leading zero or overflow, and, in a version this
// reader fully knows, no unknown member. The schema is derived from the
// struct tags of Checkpoint: a member whose tag has omitempty or omitzero
// is optional, every other is required; the decoder checks at start-up
// that it decodes exactly the schema's members. Validate checks ranges.

// valueKind is what a schema member's value must be.
type valueKind uint8

const (
	kindString valueKind = iota // a JSON string (also a time)
	kindNumber                  // a JSON number
	kindArray                   // a JSON array (or null) of elem
	kindObject                  // a JSON object of schema obj
)

// member is one known member of an object.
type member struct {
	name     string
	quoted   []byte // the name as a JSON string, quotes included
	kind     valueKind
	required bool
	elem     valueKind // for kindArray
	obj      *schema   // for kindObject, or kindArray of kindObject
}

// schema is the known members of one kind of object.
type schema struct {
	what     string // "tensor", for messages
	members  []member
	required uint64 // bit i: members[i] is required
}

// lookup returns the index of the member named name exactly, or -1.
func (s *schema) lookup(name []byte) int {
	for i := range s.members {
		if s.members[i].name == string(name) {
			return i
		}
	}
	return -1
}

// folded returns the member whose name equals name under Unicode case
// folding (what the JSON library would match), or "".
func (s *schema) folded(name string) string {
	for i := range s.members {
		if strings.EqualFold(s.members[i].name, name) {
			return s.members[i].name
		}
	}
	return ""
}

var topSchema = schemaOf(reflect.TypeFor[Checkpoint](), "metadata")

var timeType = reflect.TypeFor[time.Time]()

// schemaOf derives a schema from a struct type's json tags.
func schemaOf(t reflect.Type, what string) *schema {
	s := &schema{what: what}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if tag == "-" {
			continue // in memory only (Checkpoint.SaveID), never in a document
		}
		if name == "" || name == "-" {
			panic(fmt.Sprintf("metadata: field %s.%s has no json name", t.Name(), f.Name))
		}
		m := member{name: name, quoted: []byte(strconv.Quote(name)), required: !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,")}
		switch ft := f.Type; {
		case ft == timeType || ft.Kind() == reflect.String:
			m.kind = kindString
		case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Uint64:
			m.kind = kindNumber
		case ft.Kind() == reflect.Struct:
			m.kind, m.obj = kindObject, schemaOf(ft, name)
		case ft.Kind() == reflect.Slice:
			m.kind = kindArray
			switch et := ft.Elem(); {
			case et.Kind() == reflect.String:
				m.elem = kindString
			case et.Kind() >= reflect.Int && et.Kind() <= reflect.Uint64:
				m.elem = kindNumber
			case et.Kind() == reflect.Struct:
				m.elem, m.obj = kindObject, schemaOf(et, strings.TrimSuffix(name, "s"))
			case et.Kind() == reflect.Slice:
				m.elem = kindArray // of strings: training.slot_sets
			default:
				panic(fmt.Sprintf("metadata: field %s.%s: unsupported element type %s", t.Name(), f.Name, et))
			}
		default:
			panic(fmt.Sprintf("metadata: field %s.%s: unsupported type %s", t.Name(), f.Name, ft))
		}
		if m.required {
			s.required |= 1 << len(s.members)
		}
		s.members = append(s.members, m)
	}
	if len(s.members) > 64 {
		panic("metadata: more than 64 members in " + what)
	}
	return s
}

// maxDepth bounds the nesting of unknown members a newer minor version may
// add.
const maxDepth = 64

// strictScan is the state of one strict pass.
type strictScan struct {
	data   []byte
	pos    int
	strict bool // unknown members are refused
	path   []pathElem
}

// pathElem is one step of the JSON path of the value being scanned: a
// member name, or an array index when name is "".
type pathElem struct {
	name  string
	index int
}

// firstInvalidUTF8 returns the offset of the first byte of data that does
// not start a valid UTF-8 sequence.
func firstInvalidUTF8(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(data)
}

// where renders the current JSON path, "$.tensors[3].chunks[0].object".
func (s *strictScan) where() string {
	var b strings.Builder
	b.WriteString("$")
	for _, p := range s.path {
		if p.name == "" {
			fmt.Fprintf(&b, "[%d]", p.index)
		} else {
			b.WriteString(".")
			b.WriteString(p.name)
		}
	}
	return b.String()
}

func (s *strictScan) errorf(format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, s.where(), fmt.Sprintf(format, a...))
}

func (s *strictScan) ws() {
	if s.pos < len(s.data) && s.data[s.pos] > ' ' {
		return // compact JSON: the common case
	}
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// expect consumes byte c after optional white space.
func (s *strictScan) expect(c byte) error {
	s.ws()
	if s.pos >= len(s.data) {
		return s.errorf("unexpected end of the metadata, want %q", c)
	}
	if s.data[s.pos] != c {
		return s.errorf("unexpected %q at byte %d, want %q", s.data[s.pos], s.pos, c)
	}
	s.pos++
	return nil
}

// str consumes a JSON string at s.pos and returns its raw content (between
// the quotes, escapes not decoded) and whether it holds an escape. It
// checks surrogate escapes (checkStrict has checked UTF-8); the JSON
// library checks the rest.
func (s *strictScan) str() (raw []byte, escaped bool, err error) {
	start := s.pos + 1
	d := s.data
	for i := start; i < len(d); i++ {
		switch d[i] {
		case '"':
			s.pos = i + 1
			raw = d[start:i]
			if escaped {
				err = s.checkEscapes(raw, start)
			}
			return raw, escaped, err
		case '\\':
			escaped = true
			i++ // the escaped byte, which may be a quote
		default:
			if d[i] < 0x20 {
				return nil, false, s.errorf("control character %#02x in the string at byte %d (JSON strings escape them)", d[i], start-1)
			}
		}
	}
	return nil, false, s.errorf("unterminated string at byte %d", start-1)
}

// checkEscapes refuses \u escapes of lone surrogates, which decode to no
// character.
func (s *strictScan) checkEscapes(raw []byte, at int) error {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return s.errorf("bad \\u escape in the string at byte %d", at-1)
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return s.errorf("lone low surrogate \\u%04x in the string at byte %d", r, at-1)
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), false
			if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				lo, ok = hex4(raw[i+3:])
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return s.errorf("lone high surrogate \\u%04x in the string at byte %d", r, at-1)
			}
			i += 6
		}
	}
	return nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(v), err == nil
}

// name consumes a member name and returns it decoded.
func (s *strictScan) name() (raw []byte, err error) {
	s.ws()
	if s.pos >= len(s.data) || s.data[s.pos] != '"' {
		return nil, s.errorf("want a member name at byte %d", s.pos)
	}
	raw, escaped, err := s.str()
	if err != nil || !escaped {
		return raw, err
	}
	dec, err := s.unescape(raw)
	if err != nil {
		return nil, err
	}
	return []byte(dec), nil
}

// next consumes the separator after a member or element: it reports true
// after a comma, false after the closing byte, and an error otherwise.
func (s *strictScan) next(closing byte) (bool, error) {
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == ',' {
		s.pos++
		return true, nil
	}
	return false, s.expect(closing)
}

// number consumes the bytes of a number; the JSON library checks its
// grammar and range.
func (s *strictScan) number() {
	i := s.pos
	for i < len(s.data) && numberByte[s.data[i]] {
		i++
	}
	s.pos = i
}

// numberByte marks the bytes a JSON number is made of.
var numberByte = func() (t [256]bool) {
	for _, c := range []byte("0123456789+-.eE") {
		t[c] = true
	}
	return t
}()

// token describes the value at s.pos for a message.
func (s *strictScan) token() string {
	end := min(s.pos+12, len(s.data))
	return strconv.Quote(string(s.data[s.pos:end]))
}

// any scans a value of an unknown member: any JSON value, with the object
// rules (no duplicate names, valid strings) applied inside it.
func (s *strictScan) any(depth int) error {
	if depth > maxDepth {
		return s.errorf("nested deeper than %d levels", maxDepth)
	}
	s.ws()
	if s.pos >= len(s.data) {
		return s.errorf("unexpected end of the metadata")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		it := s.open(nil, depth)
		for {
			i, err := s.member(&it)
			if err != nil || i < 0 {
				return err
			}
		}
	case c == '[':
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.any(depth + 1); err != nil {
				return err
			}
			if more, err := s.next(']'); err != nil || !more {
				return err
			}
		}
	case c == '"':
		_, _, err := s.str()
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		s.number()
		return nil
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(s.data[s.pos:], []byte(lit)) {
				s.pos += len(lit)
				return nil
			}
		}
		return s.errorf("unexpected %s", s.token())
	}
}

// objIter is the state of one object being scanned by member.
type objIter struct {
	sc        *schema // nil: an unknown member's object
	depth     int
	seen      uint64
	seenOther map[string]bool
	hint      int
	started   bool
}

// open starts scanning the object at s.pos ('{') with schema sc (nil: an
// unknown member's object, checked for duplicate names only).
func (s *strictScan) open(sc *schema, depth int) objIter {
	s.pos++ // '{'
	return objIter{sc: sc, depth: depth}
}

// member advances to the next member of the object it scans and returns
// the index of its schema member, with s.pos at the value; an unknown
// member is checked (case folding, strictness, duplicates) and skipped. It
// returns -1 after the closing brace, having checked the required members.
func (s *strictScan) member(it *objIter) (int, error) {
	if it.depth > maxDepth {
		return -1, s.errorf("nested deeper than %d levels", maxDepth)
	}
	sc := it.sc
	for {
		if !it.started {
			it.started = true
			s.ws()
			if s.pos < len(s.data) && s.data[s.pos] == '}' {
				s.pos++
				return -1, s.missing(sc, it.seen)
			}
			s.path = append(s.path, pathElem{})
		} else {
			more, err := s.next('}')
			if err != nil {
				return -1, err
			}
			if !more {
				s.path = s.path[:len(s.path)-1]
				return -1, s.missing(sc, it.seen)
			}
		}
		var nm []byte
		i := -1
		s.ws()
		// Writers put members in declaration order: try the next one
		// first, by its quoted name.
		if sc != nil && it.hint < len(sc.members) && bytes.HasPrefix(s.data[s.pos:], sc.members[it.hint].quoted) {
			i = it.hint
			s.pos += len(sc.members[i].quoted)
		} else {
			var err error
			if nm, err = s.name(); err != nil {
				return -1, err
			}
			if sc != nil {
				i = sc.lookup(nm)
			}
		}
		it.hint = i + 1
		if i >= 0 {
			s.path[len(s.path)-1] = pathElem{name: sc.members[i].name}
			if it.seen&(1<<i) != 0 {
				return -1, s.errorf("duplicate member %q", sc.members[i].name)
			}
			it.seen |= 1 << i
			if err := s.expect(':'); err != nil {
				return -1, err
			}
			return i, nil
		}
		name := string(nm)
		s.path[len(s.path)-1] = pathElem{name: name}
		if sc != nil {
			if f := sc.folded(name); f != "" {
				return -1, s.errorf("member %q differs from %q only in case (names are case-sensitive)", name, f)
			}
			if s.strict {
				return -1, s.errorf("unknown member %q in %s", name, sc.what)
			}
		}
		if it.seenOther == nil {
			it.seenOther = map[string]bool{}
		}
		if it.seenOther[name] {
			return -1, s.errorf("duplicate member %q", name)
		}
		it.seenOther[name] = true
		if err := s.expect(':'); err != nil {
			return -1, err
		}
		if err := s.any(it.depth + 1); err != nil {
			return -1, err
		}
	}
}

// missing reports the first required member of sc not in seen.
func (s *strictScan) missing(sc *schema, seen uint64) error {
	if sc == nil || seen&sc.required == sc.required {
		return nil
	}
	for i, m := range sc.members {
		if m.required && seen&(1<<i) == 0 {
			return s.errorf("%s lacks the required member %q", sc.what, m.name)
		}
	}
	return nil
}

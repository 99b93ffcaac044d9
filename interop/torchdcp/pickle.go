package torchdcp

import (
	"encoding/binary"
	"errors"
	"math"
)

// Pickle opcodes understood by the restricted unpickler (protocols 2-5 as
// written by torch.save and DCP, plus a few protocol-0/1 ones that cost
// nothing). Everything else, notably INST, OBJ, EXT*, text PERSID and
// out-of-band buffers, is refused.
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opBinFloat       = 'G'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opNone           = 'N'
	opBinPersID      = 'Q'
	opReduce         = 'R'
	opBinString      = 'T'
	opShortBinString = 'U'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opProto          = 0x80
	opNewObj         = 0x81
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opFrozenSet      = 0x91
	opNewObjEx       = 0x92
	opStackGlobal    = 0x93
	opMemoize        = 0x94
	opFrame          = 0x95
	opByteArray8     = 0x96
)

// Limits of the unpickler. Every opcode consumes at least one input byte,
// so the memo and the number of values built are linear in the input; these
// bound the rest.
const (
	// maxGlobalLine bounds a GLOBAL opcode's module or name line.
	maxGlobalLine = 1024
	// maxStack bounds the stack and the MARK stack. Picklers batch
	// APPENDS/SETITEMS by 1000, so real pickles stay far below it.
	maxStack = 1 << 20
)

// unpickler is a restricted pickle virtual machine. It builds plain Go values
// (see globals.go) and never executes anything: globals come from a fixed
// allow-list and "calls" build records. All sizes are checked against the
// remaining input before anything is allocated, so memory stays linear in
// the input size.
type unpickler struct {
	data  []byte
	pos   int
	stack []any
	marks []int
	// memo is dense: a PUT may overwrite an entry or add the next one,
	// never skip ahead (CPython's C unpickler sizes its memo array by the
	// highest index, so one LONG_BINPUT could cost gigabytes there).
	memo []any
	// persistentLoad resolves BINPERSID; nil refuses persistent ids.
	persistentLoad func(pid any) (any, error)
	// copyBudget bounds the items copied by "calls" (REDUCE, NEWOBJ), which
	// may take the same memoised sequence many times.
	copyBudget int
}

// unpickle runs a pickle to its STOP opcode and returns the top value.
func unpickle(data []byte, persistentLoad func(any) (any, error)) (any, error) {
	u := &unpickler{data: data, persistentLoad: persistentLoad, copyBudget: 4*len(data) + 4096}
	return u.run()
}

func (u *unpickler) need(n int) ([]byte, error) {
	if n < 0 || n > len(u.data)-u.pos {
		return nil, malformed("pickle truncated at byte %d (need %d more bytes)", u.pos, n)
	}
	b := u.data[u.pos : u.pos+n]
	u.pos += n
	return b, nil
}

// length reads an n-byte little-endian length and checks it against the
// remaining input.
func (u *unpickler) length(n int) (int, error) {
	b, err := u.need(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	switch n {
	case 1:
		v = uint64(b[0])
	case 4:
		v = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		v = binary.LittleEndian.Uint64(b)
	}
	if v > uint64(len(u.data)-u.pos) {
		return 0, malformed("length %d at byte %d exceeds the %d remaining bytes", v, u.pos, len(u.data)-u.pos)
	}
	return int(v), nil
}

func (u *unpickler) line() (string, error) {
	for i := u.pos; i < len(u.data) && i-u.pos <= maxGlobalLine; i++ {
		if u.data[i] == '\n' {
			s := string(u.data[u.pos:i])
			u.pos = i + 1
			return s, nil
		}
	}
	return "", malformed("unterminated or over-long GLOBAL line at byte %d", u.pos)
}

func (u *unpickler) push(v any) error {
	if len(u.stack) >= maxStack {
		return malformed("pickle stack deeper than %d at byte %d", maxStack, u.pos)
	}
	u.stack = append(u.stack, v)
	return nil
}

// charge accounts for the items a call may copy out of its arguments.
func (u *unpickler) charge(args pyTuple) error {
	n := len(args)
	for _, a := range args {
		if s, ok := a.(torchSize); ok {
			n += len(s)
		} else if items, ok := seqItems(a); ok {
			n += 2 * len(items)
		}
	}
	u.copyBudget -= n
	if u.copyBudget < 0 {
		return malformed("pickle copies more data than its size allows (byte %d)", u.pos)
	}
	return nil
}

func (u *unpickler) pop() (any, error) {
	base := 0
	if len(u.marks) > 0 {
		base = u.marks[len(u.marks)-1]
	}
	if len(u.stack) <= base {
		return nil, malformed("stack underflow at byte %d", u.pos)
	}
	v := u.stack[len(u.stack)-1]
	u.stack = u.stack[:len(u.stack)-1]
	return v, nil
}

func (u *unpickler) top() (any, error) {
	base := 0
	if len(u.marks) > 0 {
		base = u.marks[len(u.marks)-1]
	}
	if len(u.stack) <= base {
		return nil, malformed("stack underflow at byte %d", u.pos)
	}
	return u.stack[len(u.stack)-1], nil
}

// popMark returns the items above the innermost MARK and removes them and
// the mark.
func (u *unpickler) popMark() ([]any, error) {
	if len(u.marks) == 0 {
		return nil, malformed("no MARK on the stack at byte %d", u.pos)
	}
	m := u.marks[len(u.marks)-1]
	u.marks = u.marks[:len(u.marks)-1]
	items := append([]any(nil), u.stack[m:]...)
	u.stack = u.stack[:m]
	return items, nil
}

// apply pops a callable and an argument tuple (REDUCE, NEWOBJ) and pushes
// what f builds from them.
func (u *unpickler) apply(op string, f func(callee any, args pyTuple) (any, error)) error {
	items, err := u.popN(2)
	if err != nil {
		return err
	}
	args, ok := items[1].(pyTuple)
	if !ok {
		return malformed("%s arguments are %s, not a tuple", op, typeName(items[1]))
	}
	if err := u.charge(args); err != nil {
		return err
	}
	v, err := f(items[0], args)
	if err != nil {
		return err
	}
	return u.push(v)
}

func (u *unpickler) popN(n int) ([]any, error) {
	out := make([]any, n)
	for i := n - 1; i >= 0; i-- {
		v, err := u.pop()
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (u *unpickler) memoPut(idx uint32) error {
	v, err := u.top()
	if err != nil {
		return err
	}
	switch {
	case int64(idx) < int64(len(u.memo)):
		u.memo[idx] = v
	case int64(idx) == int64(len(u.memo)):
		u.memo = append(u.memo, v)
	default:
		return malformed("memo index %d skips ahead of the %d entries so far (byte %d)", idx, len(u.memo), u.pos)
	}
	return nil
}

func (u *unpickler) memoGet(idx uint32) error {
	if int64(idx) >= int64(len(u.memo)) {
		return malformed("memo entry %d is not defined (byte %d)", idx, u.pos)
	}
	return u.push(u.memo[idx])
}

func (u *unpickler) run() (any, error) {
	for {
		opb, err := u.need(1)
		if err != nil {
			return nil, malformed("pickle ends without STOP")
		}
		op := opb[0]
		if err := u.step(op); err != nil {
			if err == errStop {
				v, err := u.pop()
				if err != nil {
					return nil, err
				}
				return v, nil
			}
			return nil, err
		}
	}
}

// errStop signals the STOP opcode to run.
var errStop = errors.New("STOP")

func (u *unpickler) step(op byte) error {
	switch op {
	case opStop:
		return errStop
	case opProto:
		b, err := u.need(1)
		if err != nil {
			return err
		}
		if b[0] < 2 || b[0] > 5 {
			return malformed("pickle protocol %d is not supported (2-5)", b[0])
		}
	case opFrame:
		if _, err := u.length(8); err != nil {
			return err
		}
	case opMark:
		if len(u.marks) >= maxStack {
			return malformed("more than %d nested MARKs", maxStack)
		}
		u.marks = append(u.marks, len(u.stack))
	case opPop:
		_, err := u.pop()
		return err
	case opPopMark:
		_, err := u.popMark()
		return err
	case opDup:
		v, err := u.top()
		if err != nil {
			return err
		}
		return u.push(v)
	case opNone:
		return u.push(nil)
	case opNewTrue:
		return u.push(true)
	case opNewFalse:
		return u.push(false)
	case opBinInt:
		b, err := u.need(4)
		if err != nil {
			return err
		}
		return u.push(int64(int32(binary.LittleEndian.Uint32(b))))
	case opBinInt1:
		b, err := u.need(1)
		if err != nil {
			return err
		}
		return u.push(int64(b[0]))
	case opBinInt2:
		b, err := u.need(2)
		if err != nil {
			return err
		}
		return u.push(int64(binary.LittleEndian.Uint16(b)))
	case opLong1, opLong4:
		w := 1
		if op == opLong4 {
			w = 4
		}
		n, err := u.length(w)
		if err != nil {
			return err
		}
		b, err := u.need(n)
		if err != nil {
			return err
		}
		v, err := decodeLong(b)
		if err != nil {
			return err
		}
		return u.push(v)
	case opBinFloat:
		b, err := u.need(8)
		if err != nil {
			return err
		}
		return u.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
	case opShortBinUni, opBinUnicode, opBinUnicode8, opShortBinString, opBinString:
		w := lengthWidth(op)
		n, err := u.length(w)
		if err != nil {
			return err
		}
		b, err := u.need(n)
		if err != nil {
			return err
		}
		return u.push(string(b))
	case opShortBinBytes, opBinBytes, opBinBytes8, opByteArray8:
		w := lengthWidth(op)
		n, err := u.length(w)
		if err != nil {
			return err
		}
		b, err := u.need(n)
		if err != nil {
			return err
		}
		return u.push(append([]byte{}, b...))
	case opEmptyTuple:
		return u.push(pyTuple{})
	case opTuple1, opTuple2, opTuple3:
		items, err := u.popN(int(op-opTuple1) + 1)
		if err != nil {
			return err
		}
		return u.push(pyTuple(items))
	case opTuple:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		return u.push(pyTuple(items))
	case opEmptyList:
		return u.push(&pyList{})
	case opList:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		return u.push(&pyList{items: items})
	case opAppend, opAppends:
		var items []any
		var err error
		if op == opAppend {
			items, err = u.popN(1)
		} else {
			items, err = u.popMark()
		}
		if err != nil {
			return err
		}
		t, err := u.top()
		if err != nil {
			return err
		}
		l, ok := t.(*pyList)
		if !ok {
			return malformed("APPEND to %s", typeName(t))
		}
		l.items = append(l.items, items...)
	case opEmptySet:
		return u.push(&pyList{set: true})
	case opAddItems:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		t, err := u.top()
		if err != nil {
			return err
		}
		l, ok := t.(*pyList)
		if !ok {
			return malformed("ADDITEMS to %s", typeName(t))
		}
		l.items = append(l.items, items...)
	case opFrozenSet:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		return u.push(&pyList{items: items, set: true})
	case opEmptyDict:
		return u.push(&pyDict{})
	case opDict:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		d := &pyDict{}
		if err := setItems(d, items); err != nil {
			return err
		}
		return u.push(d)
	case opSetItem, opSetItems:
		var items []any
		var err error
		if op == opSetItem {
			items, err = u.popN(2)
		} else {
			items, err = u.popMark()
		}
		if err != nil {
			return err
		}
		t, err := u.top()
		if err != nil {
			return err
		}
		d, ok := t.(*pyDict)
		if !ok {
			return malformed("SETITEM on %s", typeName(t))
		}
		return setItems(d, items)
	case opGlobal:
		module, err := u.line()
		if err != nil {
			return err
		}
		name, err := u.line()
		if err != nil {
			return err
		}
		g, err := lookupGlobal(module, name)
		if err != nil {
			return err
		}
		return u.push(g)
	case opStackGlobal:
		items, err := u.popN(2)
		if err != nil {
			return err
		}
		module, ok1 := items[0].(string)
		name, ok2 := items[1].(string)
		if !ok1 || !ok2 {
			return malformed("STACK_GLOBAL needs two strings")
		}
		g, err := lookupGlobal(module, name)
		if err != nil {
			return err
		}
		return u.push(g)
	case opReduce:
		return u.apply("REDUCE", call)
	case opNewObj:
		return u.apply("NEWOBJ", newObject)
	case opNewObjEx:
		items, err := u.popN(3)
		if err != nil {
			return err
		}
		args, ok := items[1].(pyTuple)
		kw, ok2 := items[2].(*pyDict)
		if !ok || !ok2 || len(kw.keys) != 0 {
			return malformed("NEWOBJ_EX needs a tuple and empty keyword arguments")
		}
		if err := u.charge(args); err != nil {
			return err
		}
		v, err := newObject(items[0], args)
		if err != nil {
			return err
		}
		return u.push(v)
	case opBuild:
		state, err := u.pop()
		if err != nil {
			return err
		}
		t, err := u.top()
		if err != nil {
			return err
		}
		switch o := t.(type) {
		case *pyObject:
			return u.build(o, state)
		case *pyDict:
			if o.attrs != nil || state == nil {
				return malformed("BUILD on a dict twice or without state")
			}
			o.attrs = state
			return nil
		}
		return malformed("BUILD on %s", typeName(t))
	case opBinPersID:
		pid, err := u.pop()
		if err != nil {
			return err
		}
		if u.persistentLoad == nil {
			return malformed("persistent id in a pickle that must not have one")
		}
		v, err := u.persistentLoad(pid)
		if err != nil {
			return err
		}
		return u.push(v)
	case opMemoize:
		return u.memoPut(uint32(len(u.memo)))
	case opBinPut:
		b, err := u.need(1)
		if err != nil {
			return err
		}
		return u.memoPut(uint32(b[0]))
	case opLongBinPut:
		b, err := u.need(4)
		if err != nil {
			return err
		}
		return u.memoPut(binary.LittleEndian.Uint32(b))
	case opBinGet:
		b, err := u.need(1)
		if err != nil {
			return err
		}
		return u.memoGet(uint32(b[0]))
	case opLongBinGet:
		b, err := u.need(4)
		if err != nil {
			return err
		}
		return u.memoGet(binary.LittleEndian.Uint32(b))
	default:
		return malformed("unsupported pickle opcode 0x%02x at byte %d", op, u.pos-1)
	}
	return nil
}

func setItems(d *pyDict, items []any) error {
	if len(items)%2 != 0 {
		return malformed("odd number of items for a dict")
	}
	for i := 0; i < len(items); i += 2 {
		if !hashable(items[i]) {
			return malformed("unhashable dict key %s", typeName(items[i]))
		}
		d.set(items[i], items[i+1])
	}
	return nil
}

// hashable rejects the mutable containers Python refuses as dict keys.
func hashable(v any) bool {
	switch t := v.(type) {
	case *pyList, *pyDict, []byte:
		return false
	case float64:
		return !math.IsNaN(t) // NaN keys are never equal, not even to themselves
	}
	return true
}

// build applies BUILD's state to a DCP object exactly as CPython's
// load_build does, or refuses it:
//   - TensorProperties has a __setstate__, which takes the whole state and
//     unpacks it into its five fields: it must be the 5-tuple its
//     __getstate__ writes, with a member of its module's memory-format enum
//     (CPython raises on anything else);
//   - the dataclasses have none: a 2-tuple state is (state, slotstate); a
//     state that is not empty (Python truth) must be a dict, and its items
//     update the instance __dict__ (later keys win); then a slot state that
//     is not empty must be a dict of string keys, each set with setattr, so
//     it wins over the dict state. MetadataIndex is frozen (setattr raises
//     FrozenInstanceError): a slot state for it is refused.
//
// The items are copied at BUILD time, as CPython copies them into the
// instance: changing the state dict afterwards (through the memo) does not
// change the object. A second BUILD applies again, as in CPython.
func (u *unpickler) build(o *pyObject, state any) error {
	if o.class.name == "TensorProperties" {
		t, ok := state.(pyTuple)
		if !ok || len(t) != 5 {
			return malformed("TensorProperties state is %s, want the 5-tuple of its __getstate__", typeName(state))
		}
		m, ok := t[3].(enumMember)
		if !ok || m.class != memFormatEnum[o.class.family] {
			return malformed("TensorProperties memory format is %s, want a %s member", typeName(t[3]), memFormatEnum[o.class.family])
		}
		o.state = t
		return nil
	}
	var slots any
	if pair, ok := state.(pyTuple); ok && len(pair) == 2 {
		state, slots = pair[0], pair[1]
	}
	if o.fields == nil {
		o.fields = &pyDict{}
	}
	if truthy(state) {
		d, ok := state.(*pyDict)
		if !ok {
			return malformed("BUILD state of a %s is %s, not a dict", o.class.name, typeName(state))
		}
		if err := u.update(o.fields, d); err != nil {
			return err
		}
	}
	if truthy(slots) {
		d, ok := slots.(*pyDict)
		if !ok {
			return malformed("BUILD slot state of a %s is %s, not a dict", o.class.name, typeName(slots))
		}
		if o.class.name == "MetadataIndex" {
			return malformed("BUILD slot state for a MetadataIndex, a frozen dataclass (CPython raises FrozenInstanceError)")
		}
		for _, k := range d.keys {
			if _, ok := k.(string); !ok {
				return malformed("BUILD slot state of a %s has a %s attribute name", o.class.name, typeName(k))
			}
		}
		if err := u.update(o.fields, d); err != nil {
			return err
		}
	}
	return nil
}

// memFormatEnum is the memory-format enum of each module family.
var memFormatEnum = map[string]string{family113: "MEM_FORMAT_ENCODING", family2x: "_MEM_FORMAT_ENCODING"}

// update copies src's items into dst (dict.update), charging the copy.
func (u *unpickler) update(dst, src *pyDict) error {
	u.copyBudget -= len(src.keys)
	if u.copyBudget < 0 {
		return malformed("pickle copies more data than its size allows (byte %d)", u.pos)
	}
	for i, k := range src.keys {
		dst.set(k, src.vals[i])
	}
	return nil
}

// truthy is Python's truth value of an unpickled value.
func truthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case int64:
		return t != 0
	case float64:
		return t != 0
	case string:
		return t != ""
	case []byte:
		return len(t) > 0
	case pyTuple:
		return len(t) > 0
	case *pyList:
		return len(t.items) > 0
	case *pyDict:
		return len(t.keys) > 0
	case torchSize:
		return len(t) > 0
	}
	return true
}

// decodeLong decodes a little-endian two's-complement LONG1/LONG4 payload
// that fits in int64.
func decodeLong(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) > 8 {
		// Allow redundant sign-extension bytes only.
		ext := byte(0)
		if b[len(b)-1]&0x80 != 0 {
			ext = 0xff
		}
		for _, c := range b[8:] {
			if c != ext {
				return 0, malformed("integer of %d bytes does not fit in 64 bits", len(b))
			}
		}
		if (b[7]&0x80 != 0) != (ext == 0xff) {
			return 0, malformed("integer of %d bytes does not fit in 64 bits", len(b))
		}
		b = b[:8]
	}
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	if n := uint(len(b)) * 8; n < 64 && b[len(b)-1]&0x80 != 0 {
		v |= ^uint64(0) << n
	}
	return int64(v), nil
}

// lengthWidth is the size of the length prefix of a string or bytes opcode.
func lengthWidth(op byte) int {
	switch op {
	case opShortBinUni, opShortBinString, opShortBinBytes:
		return 1
	case opBinUnicode8, opBinBytes8, opByteArray8:
		return 8
	}
	return 4
}

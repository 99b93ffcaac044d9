package metadata

import (
	"bytes"
	"fmt"
	"strconv"

	gojson "github.com/goccy/go-json"
)

// tensorsMember is how the library writes an empty tensors array; Encode
// writes every member but the tensors with it, then splices the tensors in
// there. The sequence cannot occur inside a JSON string (a quote in a
// string is always escaped), so its first occurrence is the member.
var tensorsMember = []byte(`"tensors":[]`)

// encodeJSON writes c as the library writes it (compact, no HTML escaping,
// invalid UTF-8 replaced, a trailing newline), the tensors appended by
// appendTensors into one buffer presized from the entries: at a million
// chunk entries the library's generic path spent most of its time growing
// and copying its buffer.
func encodeJSON(c *Checkpoint) ([]byte, error) {
	rest := *c
	rest.Tensors = []TensorEntry{}
	var head bytes.Buffer
	enc := gojson.NewEncoder(&head)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&rest); err != nil {
		return nil, err
	}
	h := head.Bytes()
	at := bytes.Index(h, tensorsMember)
	if at < 0 {
		return nil, fmt.Errorf("no tensors member in %.80q", h)
	}
	split := at + len(tensorsMember) - 1                                  // at the closing ]
	out := make([]byte, 0, len(h)+tensorsSize(c.Tensors)+len(sealSep)+12) // room for the seal
	out = append(out, h[:split]...)
	out, err := appendTensors(out, c.Tensors)
	if err != nil {
		return nil, err
	}
	return append(out, h[split:]...), nil
}

// tensorsSize estimates the encoded size of tensors (slightly above it for
// the usual keys and numbers, so the buffer grows at most once).
func tensorsSize(tensors []TensorEntry) int {
	n := 0
	for i := range tensors {
		t := &tensors[i]
		n += 48 + len(t.Key) + len(t.DType) + 21*len(t.Shape)
		for j := range t.Chunks {
			ch := &t.Chunks[j]
			n += 120 + len(ch.Object) + len(ch.Encoding) + 21*(len(ch.Offsets)+len(ch.Sizes))
		}
	}
	return n
}

// appendTensors appends the elements of the tensors array, each as the
// library would write a TensorEntry.
func appendTensors(b []byte, tensors []TensorEntry) ([]byte, error) {
	var err error
	for i := range tensors {
		t := &tensors[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		if b, err = appendString(b, t.Key); err != nil {
			return nil, err
		}
		b = append(b, `,"dtype":`...)
		if b, err = appendString(b, t.DType); err != nil {
			return nil, err
		}
		b = append(b, `,"shape":`...)
		b = appendInts(b, t.Shape)
		b = append(b, `,"chunks":`...)
		if t.Chunks == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '[')
			for j := range t.Chunks {
				if j > 0 {
					b = append(b, ',')
				}
				if b, err = appendChunk(b, &t.Chunks[j]); err != nil {
					return nil, err
				}
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return b, nil
}

func appendChunk(b []byte, ch *Chunk) ([]byte, error) {
	var err error
	b = append(b, `{"offsets":`...)
	b = appendInts(b, ch.Offsets)
	b = append(b, `,"sizes":`...)
	b = appendInts(b, ch.Sizes)
	b = append(b, `,"object":`...)
	if b, err = appendString(b, ch.Object); err != nil {
		return nil, err
	}
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, ch.Offset, 10)
	b = append(b, `,"length":`...)
	b = strconv.AppendInt(b, ch.Length, 10)
	b = append(b, `,"crc32c":`...)
	b = strconv.AppendUint(b, uint64(ch.CRC32C), 10)
	if ch.Encoding != "" {
		b = append(b, `,"encoding":`...)
		if b, err = appendString(b, ch.Encoding); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendInts appends a JSON array of integers (null for a nil slice, as
// the library writes it).
func appendInts(b []byte, v []int64) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string: printable ASCII other than the
// quote and the backslash as it is (every key and object name ckptkit
// writes), anything else through the library, so escapes and UTF-8
// handling are the library's.
func appendString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, err := gojson.MarshalWithOption(s, gojson.DisableHTMLEscape())
			if err != nil {
				return nil, err
			}
			return append(b, q...), nil
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}

package metadata

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/ckptkit/ckptkit/internal/crc32c"
)

// The seal: the metadata object carries the CRC32C (Castagnoli) of its own
// body in its last top-level member, so that a flipped bit anywhere in the
// document (an iteration, a world size, a version) is caught before the
// document is decoded. The document stays plain JSON that any reader can
// parse; docs/FORMAT.md ("The seal") specifies it:
//
//	{"format":"ckptkit",...,"training":{...},"metadata_crc32c":3735928559}
//	                                        ^ the CRC covers every byte before this comma
//
// The member is written exactly as `,"metadata_crc32c":` followed by the
// CRC in decimal and the closing brace, then optional white space.

// SealMember is the name of the member that holds the seal.
const SealMember = "metadata_crc32c"

// SealMinorVersion is the first minor version of major 1 whose documents
// must carry a seal; older ones (1.0) are read without one.
const SealMinorVersion = 1

var (
	sealSep = []byte(`,"` + SealMember + `":`)
)

// Seal returns doc, a JSON object, with a fresh seal as its last member: an
// existing seal is replaced. It does not check the rest of the document.
func Seal(doc []byte) ([]byte, error) {
	body, _, found, err := splitSeal(doc)
	if err != nil {
		return nil, err
	}
	if !found {
		t := bytes.TrimRight(doc, " \t\r\n")
		if len(t) < 2 || t[0] != '{' || t[len(t)-1] != '}' {
			return nil, fmt.Errorf("%w: seal: not a JSON object", ErrInvalid)
		}
		body = bytes.TrimRight(t[:len(t)-1], " \t\r\n")
		if len(body) == 1 {
			return nil, fmt.Errorf("%w: seal: an empty JSON object", ErrInvalid)
		}
	}
	out := make([]byte, 0, len(body)+len(sealSep)+12)
	out = append(out, body...)
	out = append(out, sealSep...)
	out = strconv.AppendUint(out, uint64(crc32c.Checksum(body)), 10)
	return append(out, '}', '\n'), nil
}

// sealEncoded seals a document Encode has just written, which has no seal
// member (Encode omits a zero MetadataCRC32C, and the member's bytes cannot
// occur inside a JSON string), so no search for one is needed; the seal is
// appended in place when doc's capacity allows.
func sealEncoded(doc []byte) []byte {
	t := bytes.TrimRight(doc, " \t\r\n")
	body := bytes.TrimRight(t[:len(t)-1], " \t\r\n") // Encode wrote an object: t ends in '}'
	crc := crc32c.Checksum(body)
	out := append(body, sealSep...)
	out = strconv.AppendUint(out, uint64(crc), 10)
	return append(out, '}', '\n')
}

// checkSeal verifies data's seal when it has one. sealed reports whether it
// had one; a seal that is present but malformed, misplaced or wrong is
// ErrInvalid.
func checkSeal(data []byte) (sealed bool, err error) {
	body, stored, found, err := splitSeal(data)
	if err != nil || !found {
		return false, err
	}
	if got := crc32c.Checksum(body); got != stored {
		return true, fmt.Errorf("%w: $.%s: the metadata object is corrupt: stored CRC32C %08x, computed %08x over its first %d bytes", ErrInvalid, SealMember, stored, got, len(body))
	}
	return true, nil
}

// splitSeal finds the seal at the end of data: the body it covers and the
// stored CRC. found is false when data has no `,"metadata_crc32c":`
// anywhere; when it has one that is not a well-formed last member, err says
// so.
func splitSeal(data []byte) (body []byte, crc uint32, found bool, err error) {
	i := bytes.LastIndex(data, sealSep)
	if i < 0 {
		return nil, 0, false, nil
	}
	tail := data[i+len(sealSep):]
	n := 0
	for n < len(tail) && tail[n] >= '0' && tail[n] <= '9' {
		n++
	}
	rest := bytes.TrimRight(tail[n:], " \t\r\n")
	v, perr := strconv.ParseUint(string(tail[:n]), 10, 32)
	if perr != nil || (n > 1 && tail[0] == '0') || len(rest) != 1 || rest[0] != '}' {
		return nil, 0, true, fmt.Errorf("%w: $.%s must be the document's last member, an unsigned 32-bit decimal integer followed by the closing brace", ErrInvalid, SealMember)
	}
	return data[:i], uint32(v), true, nil
}

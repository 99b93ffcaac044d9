package metadata

import (
	"fmt"
	"sync"
)

// ChunkDecoder turns the stored bytes of one chunk or bytes entry (exactly
// Length bytes read at Offset of Object) into the raw little-endian
// row-major bytes of the chunk (for tensors, numel(sizes)*elemsize bytes of
// dtype) or the raw value (for bytes entries, dtype "" and sizes nil).
type ChunkDecoder func(stored []byte, dtype string, sizes []int64) ([]byte, error)

// Format is a checkpoint format a loader can read: ckptkit's own and
// foreign ones (PyTorch DCP) registered by their packages.
type Format struct {
	// Name identifies the format ("ckptkit", "torch-dcp").
	Name string
	// ObjectKey is the key of the format's metadata object inside a
	// checkpoint prefix; its presence is the format's commit point.
	ObjectKey string
	// Decode parses the metadata object's bytes into the common model.
	Decode func(data []byte) (*Checkpoint, error)
	// Encodings maps chunk encodings this format uses to their decoders.
	Encodings map[string]ChunkDecoder
	// Complete, when set, fills what the metadata object alone cannot say
	// (for example a foreign format's iteration, stored as a data item),
	// reading items through read. Loaders call it once after Decode.
	Complete func(c *Checkpoint, read ItemReader) error
	// WrittenObject, when set, says whether rel (a key relative to a
	// checkpoint prefix, not the metadata object) is a data object ckptkit
	// writes in this format, and which save attempt wrote it: what lets gc
	// expire a checkpoint of the format and delete an abandoned attempt's
	// objects, never touching a name it cannot attribute. Nil for a format
	// ckptkit only reads.
	WrittenObject func(rel string) (attempt string, ok bool)
}

// ItemReader reads length bytes at offset of a data object of the
// checkpoint being opened.
type ItemReader func(object string, offset, length int64) ([]byte, error)

var (
	formatsMu sync.RWMutex
	formats   = []Format{{Name: FormatName, ObjectKey: ObjectKey, Decode: Decode}}
)

// RegisterFormat adds a foreign format. Loaders probe formats in
// registration order, native first.
func RegisterFormat(f Format) error {
	formatsMu.Lock()
	defer formatsMu.Unlock()
	for _, g := range formats {
		if g.Name == f.Name || g.ObjectKey == f.ObjectKey {
			return fmt.Errorf("register format %q: clashes with %q", f.Name, g.Name)
		}
	}
	formats = append(formats, f)
	return nil
}

// Formats lists the known formats, native first.
func Formats() []Format {
	formatsMu.RLock()
	defer formatsMu.RUnlock()
	return append([]Format(nil), formats...)
}

// Decoder returns the decoder for encoding (nil for EncodingRaw) or an
// error naming the encoding when no registered format provides one.
func Decoder(encoding string) (ChunkDecoder, error) {
	if encoding == EncodingRaw {
		return nil, nil
	}
	formatsMu.RLock()
	defer formatsMu.RUnlock()
	for _, f := range formats {
		if d, ok := f.Encodings[encoding]; ok {
			return d, nil
		}
	}
	return nil, fmt.Errorf("no decoder for chunk encoding %q", encoding)
}

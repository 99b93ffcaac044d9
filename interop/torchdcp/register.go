package torchdcp

import (
	"fmt"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
)

// Format is the DCP format as registered with the metadata package.
func Format() metadata.Format {
	return metadata.Format{
		Name:      FormatName,
		ObjectKey: ObjectKey,
		Decode:    DecodeMetadata,
		Encodings: map[string]metadata.ChunkDecoder{
			EncodingTensor: decodeTensorItem,
			EncodingBytes:  decodeBytesItem,
		},
		Complete: func(c *metadata.Checkpoint, read metadata.ItemReader) error {
			if _, err := ApplyIntegrity(c, ItemReader(read)); err != nil {
				return err
			}
			// Every bytes item is decoded once here, whichever reader
			// unpickles it later; the training state is read from them.
			items, err := CheckBytesItems(c, ItemReader(read))
			if err != nil {
				return err
			}
			if _, err := FillIteration(c, items); err != nil {
				return err
			}
			if c.Unchecked {
				if c.NoChecksums, err = recordsNoCRC32(c, items); err != nil {
					return err
				}
			}
			_, err = FillParams(c, items)
			return err
		},
		WrittenObject: WrittenObject,
	}
}

// WrittenObject reports whether rel is an object ckptkit's StorageWriter
// writes for a save, and that save's tag: a data file
// "__<rank>_<n>.<tag>.distcp" or the integrity object
// ".ckptkit-integrity.<tag>" (SaveTag: 16 lowercase hex digits). Torch's
// own names ("__0_0.distcp") and the fixed ".ckptkit-integrity" of older
// saves carry no tag and are not attributed.
func WrittenObject(rel string) (string, bool) {
	if tag, ok := strings.CutPrefix(rel, ".ckptkit-integrity."); ok {
		return tag, isTag(tag)
	}
	name, ok := strings.CutSuffix(rel, ".distcp")
	if !ok {
		return "", false
	}
	file, tag, ok := strings.Cut(name, ".")
	if !ok || !isTag(tag) {
		return "", false
	}
	rank, n, ok := strings.Cut(strings.TrimPrefix(file, "__"), "_")
	if !strings.HasPrefix(file, "__") || !ok || !isDigits(rank) || !isDigits(n) {
		return "", false
	}
	return tag, true
}

func isTag(s string) bool {
	if len(s) != SaveTagLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func init() {
	if err := metadata.RegisterFormat(Format()); err != nil {
		panic(fmt.Sprintf("torchdcp: %v", err))
	}
}

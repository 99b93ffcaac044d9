package torchdcp

import (
	"fmt"

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
			_, err = FillParams(c, items)
			return err
		},
	}
}

func init() {
	if err := metadata.RegisterFormat(Format()); err != nil {
		panic(fmt.Sprintf("torchdcp: %v", err))
	}
}

// Package torchdcp reads PyTorch distributed checkpoints ("DCP", written by
// torch.distributed.checkpoint in torch 2.x and by
// torch.distributed._shard.checkpoint in torch 1.13) into ckptkit's common
// checkpoint model.
//
// A DCP checkpoint is a prefix holding a pickled ".metadata" object and data
// files ("__<rank>_<n>.distcp") made of complete torch.save archives
// concatenated without padding, one archive per item. DecodeMetadata turns
// the metadata into a *metadata.Checkpoint whose chunks use the encodings
// "torch-save" (a tensor item) and "torch-save-bytes" (a non-tensor item);
// the package registers both decoders and the format with
// metadata.RegisterFormat in its init function, so importing it for its side
// effect is enough for a loader to read DCP checkpoints.
//
// Nothing in the checkpoint is ever executed: pickles are interpreted by a
// small restricted unpickler that knows a fixed list of torch globals and
// refuses every other one (ErrForbiddenGlobal). See docs/TORCH_DCP.md.
package torchdcp

import (
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// Sentinel errors. Every error this package returns wraps one of them (or an
// error of the metadata package), so callers classify with errors.Is.
var (
	// ErrForbiddenGlobal: a pickle refers to a global (class or function)
	// outside the allow-list. The error is a *ForbiddenGlobalError naming it.
	ErrForbiddenGlobal = ckpterr.New(ckpterr.BadCheckpoint, "torchdcp: forbidden pickle global")
	// ErrMalformed: the input is not a well-formed pickle, zip archive or
	// DCP structure this package understands (truncated data, bad opcodes,
	// wrong types, limits exceeded).
	ErrMalformed = ckpterr.New(ckpterr.BadCheckpoint, "torchdcp: malformed input")
	// ErrOpaque: a torch.save value is well formed but is not a plain Python
	// value (it holds tensors, objects, ...), so it cannot be returned as Go
	// values.
	ErrOpaque = ckpterr.New(ckpterr.Unsupported, "torchdcp: value is not a plain Python value")
	// ErrUnsupportedTransform: an item was written through a storage
	// transform (for example zstd compression, _StorageInfo's
	// transform_descriptors), which this reader does not decode.
	ErrUnsupportedTransform = ckpterr.New(ckpterr.Unsupported, "torchdcp: unsupported storage transform")
	// ErrUnsupportedDType: a tensor uses a torch dtype ckptkit has no name
	// for (complex128, float8, unsigned 16-64 bit, quantized types, ...).
	ErrUnsupportedDType = ckpterr.New(ckpterr.Unsupported, "torchdcp: unsupported tensor dtype")
	// ErrItemMismatch: a decoded item disagrees with the metadata (dtype or
	// shape).
	ErrItemMismatch = ckpterr.New(ckpterr.BadCheckpoint, "torchdcp: item does not match its metadata")
	// ErrMissingIntegrity: a checkpoint whose data objects are named for
	// the save that committed it (ckptkit's StorageWriter writes such
	// names, and an integrity object with them) has no integrity object:
	// it was deleted or never copied, and with it every CRC32C.
	ErrMissingIntegrity = ckpterr.New(ckpterr.BadCheckpoint, "torchdcp: integrity object missing")
)

// ForbiddenGlobalError names a refused pickle global. It matches
// ErrForbiddenGlobal with errors.Is.
type ForbiddenGlobalError struct {
	// Module and Name are the global's module path and qualified name.
	Module, Name string
}

// Error implements error.
func (e *ForbiddenGlobalError) Error() string {
	return fmt.Sprintf("%v %s.%s (not on the allow-list; nothing is executed)", ErrForbiddenGlobal, e.Module, e.Name)
}

// Is reports whether target is ErrForbiddenGlobal or its ckpterr class.
func (e *ForbiddenGlobalError) Is(target error) bool { return errors.Is(ErrForbiddenGlobal, target) }

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// Package loader resumes from a checkpoint: it opens ONE reader on the
// checkpoint prefix, reads the metadata exactly once, applies the resume
// rules (docs/RESUME.md), plans the reads (resharding, coalescing), reads
// the data through the same reader, checks every CRC32C, and only then
// writes into the caller's buffers.
package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/ckpterr"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
)

// Errors a load or verify can classify with errors.Is.
var (
	// ErrNoCheckpoint: the prefix holds no objects at all.
	ErrNoCheckpoint = ckpterr.New(ckpterr.NotFound, "no checkpoint at this prefix")
	// ErrIncomplete: the prefix holds data but no committed metadata (a save
	// that died or is still running); it is never loaded.
	ErrIncomplete = ckpterr.New(ckpterr.BadCheckpoint, "incomplete checkpoint: data present but metadata never committed")
	// ErrPartialOptimizerState: some but not all optimizer slots of a
	// parameter are in the checkpoint (resume rule 2).
	ErrPartialOptimizerState = ckpterr.New(ckpterr.BadCheckpoint, "partial optimizer state")
	// ErrLayoutMismatch: optimizer state was saved but none of it matches
	// any parameter of the load target (resume rule 3).
	ErrLayoutMismatch = ckpterr.New(ckpterr.BadCheckpoint, "optimizer layout or key prefix does not match the checkpoint")
	// ErrMissingKeys: keys the target needs are not in the checkpoint.
	ErrMissingKeys = ckpterr.New(ckpterr.BadCheckpoint, "keys missing from checkpoint")
	// ErrTargetMismatch: a key's kind, dtype or shape differs between checkpoint
	// and target.
	ErrTargetMismatch = ckpterr.New(ckpterr.BadCheckpoint, "checkpoint and target disagree")
	// ErrMissingObject: a data object the committed metadata names is not in
	// storage (deleted, or never copied): the checkpoint is bad, whatever
	// the storage's own "not found" said.
	ErrMissingObject = ckpterr.New(ckpterr.BadCheckpoint, "data object named by the metadata is missing")
	// ErrNotAnObject: something other than an object (a directory holding
	// objects) stands where the metadata object belongs: the checkpoint is
	// unreadable, never "uncommitted".
	ErrNotAnObject = ckpterr.New(ckpterr.BadCheckpoint, "not an object at the metadata key")
	// ErrChecksum: stored bytes do not match their CRC32C.
	ErrChecksum = ckpterr.New(ckpterr.BadCheckpoint, "checksum mismatch")
	// ErrTargetsPartlyFilled: a load failed after it had started writing
	// into the targets (a read or checksum failure in the default one-pass
	// load, or a read failure in the copy pass of a Transactional
	// verify-then-copy); reload or discard the targets.
	ErrTargetsPartlyFilled = ckpterr.New(ckpterr.Internal, "load failed after the targets were partly filled")
)

// Checkpoint is an open checkpoint: its store (the one reader every data
// read goes through) and its metadata, read once.
type Checkpoint struct {
	store  *backend.Store
	format metadata.Format
	md     *metadata.Checkpoint
	raw    []byte
	// rawSize is len(raw) as read, kept after ReleaseRawMetadata.
	rawSize int

	sizesMu sync.Mutex
	sizes   map[string]int64 // data object sizes as stored (objectSize)
}

// objectSize returns the stored size of a data object, from one Stat per
// object per open checkpoint. A missing object is ErrMissingObject.
func (c *Checkpoint) objectSize(ctx context.Context, object string) (int64, error) {
	c.sizesMu.Lock()
	n, ok := c.sizes[object]
	c.sizesMu.Unlock()
	if ok {
		return n, nil
	}
	a, err := c.store.Stat(ctx, object)
	if err != nil {
		return 0, MissingObject(err)
	}
	c.sizesMu.Lock()
	if c.sizes == nil {
		c.sizes = map[string]int64{}
	}
	c.sizes[object] = a.Size
	c.sizesMu.Unlock()
	return a.Size, nil
}

// Open reads the metadata of the checkpoint at st, probing the registered
// formats (native first) by their metadata object. It reads the metadata
// object exactly once. A prefix with data but no metadata is ErrIncomplete;
// an empty prefix is ErrNoCheckpoint.
func Open(ctx context.Context, st *backend.Store) (*Checkpoint, error) {
	for _, f := range metadata.Formats() {
		data, err := st.ReadAll(ctx, f.ObjectKey, metadata.MaxSize)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if errors.Is(err, backend.ErrObjectTooLarge) {
			return nil, fmt.Errorf("open checkpoint %s: %w: the metadata object is over the %d-byte limit of docs/FORMAT.md: %w", st, metadata.ErrInvalid, metadata.MaxSize, err)
		}
		if err != nil {
			return nil, fmt.Errorf("open checkpoint %s: %w", st, err)
		}
		md, err := f.Decode(data)
		if err != nil {
			return nil, fmt.Errorf("open checkpoint %s: decode %s: %w", st, st.URL(f.ObjectKey), err)
		}
		if f.Complete != nil {
			read := func(object string, offset, length int64) ([]byte, error) {
				// Allocate only what the object really holds: a length
				// declared by a hostile header is checked against a Stat.
				a, err := st.Stat(ctx, object)
				if err != nil {
					return nil, MissingObject(err)
				}
				if offset < 0 || length < 0 || offset > a.Size || length > a.Size-offset {
					return nil, fmt.Errorf("%w: %s holds %d bytes, %d at offset %d were asked for", ErrMissingObject, st.URL(object), a.Size, length, offset)
				}
				buf := make([]byte, length)
				return buf, MissingObject(st.ReadRange(ctx, object, offset, buf))
			}
			if err := f.Complete(md, read); err != nil {
				return nil, fmt.Errorf("open checkpoint %s: %w", st, err)
			}
		}
		return &Checkpoint{store: st, format: f, md: md, raw: data, rawSize: len(data)}, nil
	}
	// No metadata here. Tell an incomplete checkpoint (data objects) from a
	// run prefix (checkpoints below it) by looking at a bounded number of
	// keys for a nested metadata object.
	var sample, nested, shadow string
	seen := 0
	errStop := errors.New("stop")
	formats := metadata.Formats()
	err := st.List(ctx, "", func(o backend.ObjectInfo) error {
		if sample == "" {
			sample = o.Key
		}
		for _, f := range formats {
			if strings.HasPrefix(o.Key, f.ObjectKey+"/") {
				shadow = f.ObjectKey // a prefix (directory) where the metadata object belongs
				return errStop
			}
			if strings.HasSuffix(o.Key, "/"+f.ObjectKey) {
				nested = o.Key
				return errStop
			}
		}
		if seen++; seen >= 1000 {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, fmt.Errorf("open checkpoint %s: %w", st, err)
	}
	switch {
	case shadow != "":
		return nil, fmt.Errorf("open checkpoint %s: %w: %s is a prefix (directory) holding objects, not the metadata object", st, ErrNotAnObject, st.URL(shadow))
	case nested != "":
		return nil, fmt.Errorf("open checkpoint %s: %w: this is a prefix holding checkpoints (e.g. %s); name one of them, or use the run's newest (ckpt latest)",
			st, ErrNoCheckpoint, st.URL(path.Dir(nested)))
	case sample != "":
		return nil, fmt.Errorf("open checkpoint %s: %w (found %s but no metadata object %s)", st, ErrIncomplete, st.URL(sample), expectedMetadata(formats, sample))
	}
	return nil, fmt.Errorf("open checkpoint %s: %w", st, ErrNoCheckpoint)
}

// Metadata returns the checkpoint's metadata (do not modify it).
func (c *Checkpoint) Metadata() *metadata.Checkpoint { return c.md }

// FormatName returns the format the checkpoint was read as ("ckptkit",
// "torch-dcp", ...).
func (c *Checkpoint) FormatName() string { return c.format.Name }

// MetadataKey is the key of the metadata object that was read.
func (c *Checkpoint) MetadataKey() string { return c.format.ObjectKey }

// MetadataSize is the metadata object's size in bytes.
func (c *Checkpoint) MetadataSize() int { return c.rawSize }

// RawMetadata returns the metadata object's bytes exactly as read (to copy
// a checkpoint without re-encoding it), or nil after ReleaseRawMetadata. Do
// not modify them.
func (c *Checkpoint) RawMetadata() []byte { return c.raw }

// ReleaseRawMetadata lets the metadata object's bytes be collected: a
// caller that will not copy the checkpoint (inspect, verify) keeps only the
// decoded metadata, which for a huge object halves what it holds. The
// decoded metadata does not refer to these bytes.
func (c *Checkpoint) ReleaseRawMetadata() { c.raw = nil }

// Store returns the store every read goes through.
func (c *Checkpoint) Store() *backend.Store { return c.store }

// URL is the checkpoint's redacted URL.
func (c *Checkpoint) URL() string { return c.store.String() }

// MissingObject returns err with a not-found read of a data object that a
// committed checkpoint names, or a read past its end (a truncated object,
// io.ErrUnexpectedEOF), classified as ErrMissingObject (the storage error,
// and its URL, stay in the chain); other errors are returned unchanged. A
// connection cut in transit also ends in io.ErrUnexpectedEOF, but the Store
// marks it transient: it stays transient, never a missing object. Tools
// that read data objects themselves (copy) use it so that a hole in a
// checkpoint is reported as a bad checkpoint.
func MissingObject(err error) error {
	if errors.Is(err, backend.ErrTransient) {
		return err
	}
	if errors.Is(err, backend.ErrNotFound) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", ErrMissingObject, err)
	}
	return err
}

// expectedMetadata names the metadata object a prefix holding sample lacks:
// that of the format whose writer names its data objects like sample (the
// native "rank-NNNNN-NNN.data" lacks ckptkit.metadata.json, a DCP save's "__0_0.<tag>.distcp" lacks ".metadata"), else every known
// format's.
func expectedMetadata(formats []metadata.Format, sample string) string {
	if _, ok := planner.ParseObjectName(sample); ok {
		return metadata.ObjectKey
	}
	for _, f := range formats {
		if f.WrittenObject != nil {
			if _, ok := f.WrittenObject(sample); ok {
				return f.ObjectKey
			}
		}
	}
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.ObjectKey
	}
	return strings.Join(names, " or ")
}

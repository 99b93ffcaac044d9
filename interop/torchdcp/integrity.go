package torchdcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/metadata"
)

// IntegrityKey is the fixed key of the integrity object that ckptkit's DCP
// StorageWriter (python/ckptkit/torch) wrote before it named objects per
// save: readers fall back to it when the per-save object
// (IntegrityKeyFor) is absent. Checkpoints written by torch itself have
// neither. docs/TORCH_DCP.md specifies the object.
const IntegrityKey = ".ckptkit-integrity"

// SaveTagLen is the length of a save tag (SaveTag).
const SaveTagLen = 16

// SaveTag returns the short form of a DCP save id (storage_meta.save_id)
// that ckptkit's StorageWriter puts in the name of every object of a save:
// the first SaveTagLen characters of the id without its dashes, when those
// are lowercase hexadecimal digits (a uuid4's are), and "" otherwise (no
// per-save names).
func SaveTag(saveID string) string {
	tag := make([]byte, 0, SaveTagLen)
	for i := 0; i < len(saveID) && len(tag) < SaveTagLen; i++ {
		switch ch := saveID[i]; {
		case ch == '-':
		case ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'f':
			tag = append(tag, ch)
		default:
			return ""
		}
	}
	if len(tag) < SaveTagLen {
		return ""
	}
	return string(tag)
}

// IntegrityKeyFor returns the key of the integrity object of the save
// whose id is saveID: IntegrityKey + "." + SaveTag(saveID), or IntegrityKey
// when the id has no tag.
func IntegrityKeyFor(saveID string) string {
	if tag := SaveTag(saveID); tag != "" {
		return IntegrityKey + "." + tag
	}
	return IntegrityKey
}

// IntegrityHeaderSize is the length of the integrity object's first line,
// "ckptkit-dcp-integrity/1 <object size in decimal>" padded with spaces to
// IntegrityHeaderSize-1 bytes and ended by "\n". The JSON body follows.
const IntegrityHeaderSize = 64

// integrityMagic starts the header line; "/1" is the major version.
const integrityMagic = "ckptkit-dcp-integrity/1 "

// maxIntegritySize caps the integrity object (like metadata.MaxSize for
// the metadata).
const maxIntegritySize = metadata.MaxSize

// Integrity is the JSON body of the integrity object.
type Integrity struct {
	// Algorithm is "crc32c" (Castagnoli).
	Algorithm string `json:"algorithm"`
	// Items lists every stored item (tensor chunk or bytes value) by its
	// byte range in a data object, with its CRC32C.
	Items []IntegrityItem `json:"items"`
	// Optimizer is the training-state record's optimizer part: "saved",
	// "omitted" (save_optimizer=False) or "none".
	Optimizer string `json:"optimizer,omitempty"`
	// Params, SlotSets and ParamSlots are the slot census, as in the
	// native format's training record (docs/FORMAT.md, The slot census):
	// the optimizer's parameters (sorted), the distinct sets of slot names
	// they saved, and each parameter's set (-1: no saved state). Absent
	// when the writer did not know the optimizer's state.
	Params     []string   `json:"params,omitempty"`
	SlotSets   [][]string `json:"slot_sets,omitempty"`
	ParamSlots []int      `json:"param_slots,omitempty"`
}

// IntegrityItem is one stored item's range and checksum.
type IntegrityItem struct {
	Object string `json:"object"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	CRC32C uint32 `json:"crc32c"`
}

// EncodeIntegrity returns the integrity object's bytes for in.
func EncodeIntegrity(in *Integrity) ([]byte, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	total := IntegrityHeaderSize + len(body)
	head := integrityMagic + strconv.Itoa(total)
	head += strings.Repeat(" ", IntegrityHeaderSize-1-len(head)) + "\n"
	return append([]byte(head), body...), nil
}

// DecodeIntegrity parses a whole integrity object.
func DecodeIntegrity(data []byte) (*Integrity, error) {
	size, err := integritySize(data)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != size {
		return nil, malformed("integrity object is %d bytes, its header says %d", len(data), size)
	}
	var in Integrity
	if err := json.Unmarshal(data[IntegrityHeaderSize:], &in); err != nil {
		return nil, malformed("integrity object: %v", err)
	}
	if in.Algorithm != "crc32c" {
		return nil, malformed("integrity object: algorithm %q, want crc32c", in.Algorithm)
	}
	return &in, nil
}

// integritySize parses the header line and returns the object's size.
func integritySize(data []byte) (int64, error) {
	if len(data) < IntegrityHeaderSize || data[IntegrityHeaderSize-1] != '\n' {
		return 0, malformed("integrity object: no %d-byte header line", IntegrityHeaderSize)
	}
	rest, ok := strings.CutPrefix(string(data[:IntegrityHeaderSize-1]), integrityMagic)
	if !ok {
		return 0, malformed("integrity object: header does not start with %q (a newer major version?)", integrityMagic)
	}
	n, err := strconv.ParseInt(strings.TrimRight(rest, " "), 10, 64)
	if err != nil || n < IntegrityHeaderSize || n > maxIntegritySize {
		return 0, malformed("integrity object: bad size in header %q", strings.TrimRight(string(data[:IntegrityHeaderSize-1]), " "))
	}
	return n, nil
}

// ApplyIntegrity reads the integrity object through read, when the
// checkpoint has one, and sets the CRC32C of every chunk and bytes entry
// from it (loaders then check every item's stored bytes against it) and
// the optimizer part of the training-state record, and lists the object in
// c.Objects (so copies carry it). The object is the one of the save that
// committed the metadata, IntegrityKeyFor(c.SaveID), or else (checkpoints
// written before objects were named per save) IntegrityKey. A checkpoint
// without either (written by torch itself) is marked c.Unchecked and
// reported false. An object that does not cover every item is malformed.
func ApplyIntegrity(c *metadata.Checkpoint, read ItemReader) (bool, error) {
	key := IntegrityKeyFor(c.SaveID)
	head, err := read(key, 0, IntegrityHeaderSize)
	if errors.Is(err, ckpterr.ErrNotFound) && key != IntegrityKey {
		key = IntegrityKey
		head, err = read(key, 0, IntegrityHeaderSize)
	}
	if errors.Is(err, ckpterr.ErrNotFound) {
		// Torch's own checkpoints have none; one whose data objects carry
		// the committing save's tag was written by ckptkit with one.
		if tag := SaveTag(c.SaveID); tag != "" && namedForSave(c, tag) {
			return false, fmt.Errorf("%w: neither %s nor %s exists, but the data objects are named for save %s, which ckptkit writes with its CRC32Cs", ErrMissingIntegrity, IntegrityKeyFor(c.SaveID), IntegrityKey, tag)
		}
		c.Unchecked = true
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	size, err := integritySize(head)
	if err != nil {
		return false, fmt.Errorf("%s: %w", key, err)
	}
	whole, err := read(key, 0, size)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	in, err := DecodeIntegrity(whole)
	if err != nil {
		return false, fmt.Errorf("%s: %w", key, err)
	}
	type rng struct {
		object         string
		offset, length int64
	}
	ikey := key
	crcs := make(map[rng]uint32, len(in.Items))
	for _, it := range in.Items {
		crcs[rng{it.Object, it.Offset, it.Length}] = it.CRC32C
	}
	lookup := func(key, object string, offset, length int64) (uint32, error) {
		crc, ok := crcs[rng{object, offset, length}]
		if !ok {
			return 0, malformed("integrity object %s has no CRC32C for %q (%s at offset %d, %d bytes)", ikey, key, object, offset, length)
		}
		return crc, nil
	}
	for i := range c.Tensors {
		t := &c.Tensors[i]
		for j := range t.Chunks {
			ch := &t.Chunks[j]
			if ch.CRC32C, err = lookup(t.Key, ch.Object, ch.Offset, ch.Length); err != nil {
				return false, err
			}
		}
	}
	for i := range c.Bytes {
		b := &c.Bytes[i]
		if b.CRC32C, err = lookup(b.Key, b.Object, b.Offset, b.Length); err != nil {
			return false, err
		}
	}
	// The integrity object is part of the checkpoint: copies carry it and
	// verify checks that it is there, whole.
	c.Objects = append(c.Objects, metadata.ObjectEntry{Key: key, Size: size})
	sort.Slice(c.Objects, func(i, j int) bool { return c.Objects[i].Key < c.Objects[j].Key })
	if in.Optimizer == metadata.OptimizerOmitted && c.Training.Optimizer == metadata.OptimizerNone {
		c.Training.Optimizer = metadata.OptimizerOmitted
	}
	if len(in.ParamSlots) > 0 || len(in.SlotSets) > 0 {
		census := metadata.TrainingState{Params: in.Params, SlotSets: in.SlotSets, ParamSlots: in.ParamSlots}
		if !slices.IsSorted(in.Params) || len(slices.Compact(slices.Clone(in.Params))) != len(in.Params) {
			return false, malformed("integrity object %s: params are not sorted and distinct", ikey)
		}
		if err := census.CheckCensus(); err != nil {
			return false, malformed("integrity object %s: %v", ikey, err)
		}
		c.Training.Params, c.Training.SlotSets, c.Training.ParamSlots = in.Params, in.SlotSets, in.ParamSlots
	}
	return true, nil
}

// namedForSave reports whether a data object of c is named for the save
// tagged tag ("__<rank>_<n>.<tag>.distcp", as StorageWriter names them).
func namedForSave(c *metadata.Checkpoint, tag string) bool {
	suffix := "." + tag + ".distcp"
	for _, o := range c.Objects {
		if strings.HasSuffix(o.Key, suffix) {
			return true
		}
	}
	return false
}

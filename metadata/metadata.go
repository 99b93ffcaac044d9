// Package metadata is the data model of a committed checkpoint and its
// codec (format v1, JSON, specified in docs/FORMAT.md). The metadata object
// is written last and is a checkpoint's only commit point.
package metadata

import (
	"slices"
	"strings"
	"time"
)

// Format identifiers.
const (
	// FormatName is the value of Checkpoint.Format for native checkpoints.
	FormatName = "ckptkit"
	// MajorVersion and MinorVersion are the format version this package
	// writes. Readers refuse a newer major version and accept newer minors,
	// ignoring the fields they do not know.
	MajorVersion = 1
	MinorVersion = 1
	// ObjectKey is the metadata object's key inside a checkpoint prefix.
	ObjectKey = "ckptkit.metadata.json"
	// MaxSize bounds a metadata object's size on decode.
	MaxSize = 1 << 30
)

// Optimizer presence values of TrainingState.Optimizer.
const (
	// OptimizerSaved: optimizer state was saved (possibly with lazily
	// absent per-parameter state).
	OptimizerSaved = "saved"
	// OptimizerOmitted: the caller deliberately did not save the optimizer.
	OptimizerOmitted = "omitted"
	// OptimizerNone: the training job has no optimizer state at all.
	OptimizerNone = "none"
)

// Chunk encodings. The empty encoding is raw little-endian row-major bytes
// protected by CRC32C; foreign formats (for example PyTorch DCP) use their
// own encodings, which readers decode before use.
const (
	EncodingRaw = ""
)

// Checkpoint is the whole metadata of one checkpoint.
type Checkpoint struct {
	// Format is FormatName for native checkpoints; readers of foreign
	// formats set their own (for example "torch-dcp").
	Format string `json:"format"`
	// Version is "MAJOR.MINOR".
	Version string `json:"version"`
	// Writer names the software that wrote the checkpoint.
	Writer string `json:"writer"`
	// CreatedAt is when the save was committed (UTC).
	CreatedAt time.Time `json:"created_at"`
	// WorldSize is the number of ranks that saved.
	WorldSize int `json:"world_size"`
	// Tensors are sorted by key.
	Tensors []TensorEntry `json:"tensors"`
	// Bytes are opaque values (scheduler state, RNG state, ...), sorted by key.
	Bytes []BytesEntry `json:"bytes"`
	// Objects lists every data object with its size, sorted by key.
	Objects []ObjectEntry `json:"objects"`
	// Training is the training-state record.
	Training TrainingState `json:"training"`
	// SaveID identifies the save that wrote a foreign-format checkpoint when
	// its metadata records one (a DCP .metadata's storage_meta.save_id); the
	// format's Complete hook finds objects named per save by it. Never part
	// of the native document (not encoded, not decoded).
	SaveID string `json:"-"`
	// Unchecked is set by a foreign format's Complete hook when the format
	// recorded no CRC32C for its items (a DCP checkpoint written by torch
	// itself, with no ckptkit integrity object): their stored bytes cannot
	// be checked, only the objects' sizes. Native checkpoints are always
	// checked. Never part of the native document.
	Unchecked bool `json:"-"`
	// NoChecksums is set with Unchecked when the stored items carry no
	// checksum of their own either (a DCP checkpoint torch saved with
	// compute_crc32 = False: every zip entry records CRC-32 0): a deep
	// verify reads and decodes every item but cannot detect a flipped data
	// byte. Never part of the native document.
	NoChecksums bool `json:"-"`
	// MetadataCRC32C is the seal: the CRC32C of the document's bytes before
	// this member, which is always the last (see Seal). Encode computes it;
	// Decode checks it before decoding and leaves the stored value here.
	MetadataCRC32C uint32 `json:"metadata_crc32c,omitempty"`
}

// TensorEntry is one tensor key: dtype, global shape, and the chunks that
// together tile the global shape exactly.
type TensorEntry struct {
	Key    string  `json:"key"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Chunks []Chunk `json:"chunks"`
}

// Chunk is a box of a tensor (Offsets, Sizes in elements, per dimension)
// and where its bytes are stored.
type Chunk struct {
	Offsets []int64 `json:"offsets"`
	Sizes   []int64 `json:"sizes"`
	// Object is the data object's key relative to the checkpoint prefix.
	Object string `json:"object"`
	// Offset and Length are the chunk's byte range in Object.
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
	// CRC32C (Castagnoli) of the Length bytes, for EncodingRaw.
	CRC32C uint32 `json:"crc32c"`
	// Encoding is EncodingRaw (omitted) or a foreign encoding name.
	Encoding string `json:"encoding,omitempty"`
}

// BytesEntry is one opaque byte value and where it is stored.
type BytesEntry struct {
	Key      string `json:"key"`
	Object   string `json:"object"`
	Offset   int64  `json:"offset"`
	Length   int64  `json:"length"`
	CRC32C   uint32 `json:"crc32c"`
	Encoding string `json:"encoding,omitempty"`
}

// ObjectEntry is a data object of the checkpoint.
type ObjectEntry struct {
	Key  string `json:"key"`
	Size int64  `json:"size"`
}

// TrainingState is the record of what a resume needs besides the model:
// iteration, scheduler and optimizer, each saved or deliberately omitted.
type TrainingState struct {
	// Iteration is the training step the checkpoint was taken after.
	Iteration int64 `json:"iteration"`
	// Optimizer is OptimizerSaved, OptimizerOmitted or OptimizerNone.
	Optimizer string `json:"optimizer"`
	// OptimizerPrefix is the key prefix of optimizer entries (default
	// "optimizer"): per-parameter state is under
	// "<prefix>.state.<fqn>.<slot>".
	OptimizerPrefix string `json:"optimizer_prefix,omitempty"`
	// OptimizerSlots are the slot names per parameter (AdamW: step,
	// exp_avg, exp_avg_sq).
	OptimizerSlots []string `json:"optimizer_slots,omitempty"`
	// OptimizerStateEntries counts the saved per-parameter state keys.
	OptimizerStateEntries int `json:"optimizer_state_entries"`
	// SchedulerPrefix is the key prefix of scheduler entries ("" when the
	// job has no scheduler).
	SchedulerPrefix string `json:"scheduler_prefix,omitempty"`
	// ModelPrefix is the key prefix of model entries (default "model").
	ModelPrefix string `json:"model_prefix,omitempty"`
	// Params are the fqns of the parameters the optimizer updates (the
	// union of its param groups' params), sorted: what tells a lazily
	// absent parameter (no optimizer state yet) from a buffer, which never
	// has any. Empty when the writer did not record them (checkpoints
	// written before this field, or a save that did not know them);
	// readers then treat every model key as a parameter.
	Params []string `json:"params,omitempty"`
	// SlotSets and ParamSlots are the slot census: what each parameter's
	// optimizer state held when it was saved, so that a reader without the
	// optimizer (ckpt verify, latest, gc) judges each parameter exactly
	// (docs/RESUME.md). SlotSets are the distinct sets of slot names (each
	// sorted bytewise, distinct); ParamSlots, aligned with Params, gives
	// each parameter's set as an index into SlotSets, or -1 for a
	// parameter without saved state (lazily absent). Both empty when the
	// writer recorded no census (readers then use the subset rule).
	SlotSets   [][]string `json:"slot_sets,omitempty"`
	ParamSlots []int      `json:"param_slots,omitempty"`
	// ParamGroups are the fqns of each of the optimizer's param groups, in
	// group order, when a reader learnt them while opening the checkpoint
	// (a DCP checkpoint's "optimizer.param_groups.<i>.params" items). Not
	// part of the format: the subset rule judges a parameter's saved slots
	// against the other parameters of its group.
	ParamGroups [][]string `json:"-"`
}

// Census returns each recorded parameter's saved slot names (nil for a
// parameter without saved state) from the slot census, or nil when the
// checkpoint has none.
func (t *TrainingState) Census() map[string][]string {
	if len(t.ParamSlots) == 0 || len(t.ParamSlots) != len(t.Params) {
		return nil
	}
	out := make(map[string][]string, len(t.Params))
	for i, fqn := range t.Params {
		var slots []string
		if j := t.ParamSlots[i]; j >= 0 && j < len(t.SlotSets) {
			slots = t.SlotSets[j]
		}
		out[fqn] = slots
	}
	return out
}

// SetCensus records slots (each parameter's saved slot names; a parameter
// of Params absent from it has no saved state) as the slot census, over
// Params, which must be set first. It does nothing when Params is empty.
func (t *TrainingState) SetCensus(slots map[string][]string) {
	t.SlotSets, t.ParamSlots = nil, nil
	if len(t.Params) == 0 {
		return
	}
	index := map[string]int{}
	t.ParamSlots = make([]int, len(t.Params))
	for i, fqn := range t.Params {
		set := slices.Clone(slots[fqn])
		if len(set) == 0 {
			t.ParamSlots[i] = -1
			continue
		}
		slices.Sort(set)
		set = slices.Compact(set)
		id := strings.Join(set, "\x00")
		j, ok := index[id]
		if !ok {
			j = len(t.SlotSets)
			index[id] = j
			t.SlotSets = append(t.SlotSets, set)
		}
		t.ParamSlots[i] = j
	}
}

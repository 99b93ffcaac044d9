package torchdcp

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptkit/ckptkit/keys"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// Names of the format and its chunk encodings in the common model.
const (
	// FormatName is Checkpoint.Format for DCP checkpoints.
	FormatName = "torch-dcp"
	// ObjectKey is DCP's metadata object (the commit point).
	ObjectKey = ".metadata"
	// EncodingTensor marks a chunk stored as a torch.save archive of one
	// tensor.
	EncodingTensor = "torch-save"
	// EncodingBytes marks a bytes entry stored as a torch.save archive of a
	// Python value.
	EncodingBytes = "torch-save-bytes"
	// VersionTorch113 is Checkpoint.Version for metadata pickled from the
	// torch.distributed._shard.checkpoint module family (torch 1.13).
	VersionTorch113 = family113
	// VersionTorch2 is Checkpoint.Version for metadata pickled from the
	// torch.distributed.checkpoint module family (torch 2.x).
	VersionTorch2 = family2x
	// OptimizerPrefix is the key prefix of optimizer entries (per-parameter
	// state under "optimizer.state.<fqn>.<slot>", torch >= 2.4 flattening).
	OptimizerPrefix = statedict.DefaultOptimizerPrefix
	// ModelPrefix is the key prefix of model entries.
	ModelPrefix = statedict.DefaultModelPrefix
	// SchedulerPrefix is the key prefix of learning-rate scheduler entries.
	SchedulerPrefix = statedict.DefaultSchedulerPrefix
)

// DecodeMetadata parses a DCP ".metadata" pickle into the common model.
//
// Every tensor key becomes a TensorEntry (dtype from the torch dtype, global
// shape, one chunk per stored box with Encoding EncodingTensor), every
// BYTE_IO key a BytesEntry with Encoding EncodingBytes; byte ranges come
// from storage_data matched on (fqn, chunk offsets). Objects are the data
// files, each sized by the end of its last item. CRC32C fields are 0: DCP
// stores no checksum of its own, and the zip entries' CRC-32 is verified
// when an item is decoded.
//
// Training state is inferred from key names: the optimizer counts as saved
// when any key starts with "optimizer.state."; Iteration is left 0 because
// the metadata does not hold values (see FillIteration). SaveID is
// storage_meta.save_id when there is one; other fields of newer versions
// (the rest of storage_meta, version, planner_data) are ignored; items
// written through a storage transform fail with ErrUnsupportedTransform.
func DecodeMetadata(data []byte) (*metadata.Checkpoint, error) {
	if len(data) > metadata.MaxSize {
		return nil, fmt.Errorf("%w: %d-byte .metadata exceeds the %d-byte limit", metadata.ErrInvalid, len(data), metadata.MaxSize)
	}
	v, err := unpickle(data, nil)
	if err != nil {
		return nil, fmt.Errorf("torch-dcp .metadata: %w", err)
	}
	md, err := object(v, "Metadata")
	if err != nil {
		return nil, fmt.Errorf("torch-dcp .metadata: %w", err)
	}
	sdm, err := dictAttr(md, "state_dict_metadata")
	if err != nil {
		return nil, err
	}
	storage, err := newStorageIndex(md)
	if err != nil {
		return nil, err
	}
	c := &metadata.Checkpoint{
		Format:  FormatName,
		Version: md.class.family,
		Writer:  writerName(md),
		SaveID:  saveID(md),
	}
	// Shared (memoised) chunk lists or sizes could otherwise multiply into
	// far more entries than the pickle's size; real metadata spends well
	// over one byte per chunk and per dimension.
	budget := 2*len(data) + 1024
	sizes := map[string]int64{}
	place := func(info storageInfo) {
		end := info.offset + info.length
		if cur, ok := sizes[info.path]; !ok || end > cur {
			sizes[info.path] = end
		}
	}
	for i, k := range sdm.keys {
		key, ok := k.(string)
		if !ok || key == "" {
			return nil, malformed("state_dict_metadata key %s", typeName(k))
		}
		entry, ok := sdm.vals[i].(*pyObject)
		if !ok {
			return nil, malformed("key %q: storage metadata is %s", key, typeName(sdm.vals[i]))
		}
		switch entry.class.name {
		case "BytesStorageMetadata":
			info, err := storage.lookup(key, nil, 0, 1)
			if err != nil {
				return nil, err
			}
			place(info)
			c.Bytes = append(c.Bytes, metadata.BytesEntry{
				Key: key, Object: info.path, Offset: info.offset, Length: info.length, Encoding: EncodingBytes,
			})
		case "TensorStorageMetadata":
			t, err := tensorEntry(key, entry, storage, &budget)
			if err != nil {
				return nil, err
			}
			for _, ch := range t.Chunks {
				place(storageInfo{path: ch.Object, offset: ch.Offset, length: ch.Length})
			}
			c.Tensors = append(c.Tensors, t)
		default:
			return nil, malformed("key %q: unexpected storage metadata %s", key, entry.class.name)
		}
	}
	for path, size := range sizes {
		c.Objects = append(c.Objects, metadata.ObjectEntry{Key: path, Size: size})
	}
	c.WorldSize = worldSize(sizes)
	c.Training = training(c)
	c.Sort()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// writerName describes the writer from the module family and, for torch
// 2.x, the metadata's own version field when present.
func writerName(md *pyObject) string {
	if md.class.family == family113 {
		return "PyTorch DCP (torch.distributed._shard.checkpoint, torch 1.13)"
	}
	w := "PyTorch DCP (torch.distributed.checkpoint, torch 2.x)"
	if ver, ok := optAttr(md, "version"); ok {
		if s, ok := ver.(string); ok && s != "" && len(s) < 64 {
			w += ", metadata version " + s
		}
	}
	return w
}

// saveID returns storage_meta.save_id (torch >= 2.4) when it is a string
// of sane length, "" otherwise: older metadata has no storage_meta, and a
// malformed one only means no per-save object names (ApplyIntegrity).
func saveID(md *pyObject) string {
	smV, _ := optAttr(md, "storage_meta")
	sm, ok := smV.(*pyObject)
	if !ok || sm.class.name != "StorageMeta" {
		return ""
	}
	v, _ := optAttr(sm, "save_id")
	if s, ok := v.(string); ok && len(s) <= 256 {
		return s
	}
	return ""
}

// tensorEntry converts a TensorStorageMetadata.
func tensorEntry(key string, entry *pyObject, storage *storageIndex, budget *int) (metadata.TensorEntry, error) {
	t := metadata.TensorEntry{Key: key}
	props, err := attr(entry, "properties")
	if err != nil {
		return t, err
	}
	dt, err := propertiesDType(key, props)
	if err != nil {
		return t, err
	}
	t.DType = dt
	sizeV, err := attr(entry, "size")
	if err != nil {
		return t, err
	}
	if t.Shape, err = intSeq(sizeV); err != nil {
		return t, fmt.Errorf("key %q size: %w", key, err)
	}
	chunksV, err := attr(entry, "chunks")
	if err != nil {
		return t, err
	}
	chunks, ok := seqItems(chunksV)
	if !ok {
		return t, malformed("key %q: chunks is %s", key, typeName(chunksV))
	}
	for j, chV := range chunks {
		ch, err := object(chV, "ChunkStorageMetadata")
		if err != nil {
			return t, fmt.Errorf("key %q chunk %d: %w", key, j, err)
		}
		offV, err := attr(ch, "offsets")
		if err != nil {
			return t, err
		}
		sizesV, err := attr(ch, "sizes")
		if err != nil {
			return t, err
		}
		offsets, err := intSeq(offV)
		if err != nil {
			return t, fmt.Errorf("key %q chunk %d offsets: %w", key, j, err)
		}
		sizes, err := intSeq(sizesV)
		if err != nil {
			return t, fmt.Errorf("key %q chunk %d sizes: %w", key, j, err)
		}
		*budget -= 1 + len(offsets) + len(sizes) + len(t.Shape)
		if *budget < 0 {
			return t, malformed("metadata describes more chunks than its size allows (at %q)", key)
		}
		info, err := storage.lookup(key, offsets, j, len(chunks))
		if err != nil {
			return t, err
		}
		t.Chunks = append(t.Chunks, metadata.Chunk{
			Offsets: offsets, Sizes: sizes,
			Object: info.path, Offset: info.offset, Length: info.length,
			Encoding: EncodingTensor,
		})
	}
	return t, nil
}

// propertiesDType reads the dtype of a TensorProperties: its state is the
// tuple (dtype, layout, requires_grad, memory_format, pin_memory) of its
// __getstate__ (build checks its form).
func propertiesDType(key string, props any) (string, error) {
	o, err := object(props, "TensorProperties")
	if err != nil {
		return "", fmt.Errorf("key %q properties: %w", key, err)
	}
	var dv any
	if st, ok := o.state.(pyTuple); ok && len(st) == 5 {
		dv = st[0]
	}
	dt, ok := dv.(torchDType)
	if !ok {
		return "", malformed("key %q: TensorProperties dtype is %s", key, typeName(dv))
	}
	if dt.ckpt == "" {
		return "", fmt.Errorf("%w: key %q has dtype %s", ErrUnsupportedDType, key, dt.torch)
	}
	return dt.ckpt, nil
}

// storageInfo is one _StorageInfo: an item's byte range in a data file.
type storageInfo struct {
	path           string
	offset, length int64
}

// storageIndex maps (fqn, chunk offsets) to storage. Bytes items have no
// offsets. The MetadataIndex "index" field is only a hint and is ignored.
type storageIndex struct {
	byKey map[string]storageInfo
	byFQN map[string][]storageInfo
}

func indexKey(fqn string, offsets []int64, tensor bool) string {
	if !tensor {
		return fqn + "\x00b"
	}
	parts := make([]string, len(offsets))
	for i, o := range offsets {
		parts[i] = strconv.FormatInt(o, 10)
	}
	return fqn + "\x00t" + strings.Join(parts, ",")
}

func newStorageIndex(md *pyObject) (*storageIndex, error) {
	sd, err := dictAttr(md, "storage_data")
	if err != nil {
		return nil, err
	}
	s := &storageIndex{byKey: make(map[string]storageInfo, len(sd.keys)), byFQN: make(map[string][]storageInfo)}
	for i, k := range sd.keys {
		mi, err := object(k, "MetadataIndex")
		if err != nil {
			return nil, fmt.Errorf("storage_data key: %w", err)
		}
		fqnV, err := attr(mi, "fqn")
		if err != nil {
			return nil, err
		}
		fqn, ok := fqnV.(string)
		if !ok {
			return nil, malformed("MetadataIndex fqn is %s", typeName(fqnV))
		}
		var offsets []int64
		offV, _ := optAttr(mi, "offset")
		if offV != nil {
			if offsets, err = intSeq(offV); err != nil {
				return nil, fmt.Errorf("storage_data %q offset: %w", fqn, err)
			}
		}
		info, err := readStorageInfo(fqn, sd.vals[i])
		if err != nil {
			return nil, err
		}
		ik := indexKey(fqn, offsets, offV != nil)
		if _, dup := s.byKey[ik]; dup {
			return nil, malformed("storage_data lists %q at offsets %v twice", fqn, offsets)
		}
		s.byKey[ik] = info
		s.byFQN[fqn] = append(s.byFQN[fqn], info)
	}
	return s, nil
}

func readStorageInfo(fqn string, v any) (storageInfo, error) {
	o, err := object(v, "_StorageInfo")
	if err != nil {
		return storageInfo{}, fmt.Errorf("storage_data %q: %w", fqn, err)
	}
	if td, _ := optAttr(o, "transform_descriptors"); td != nil {
		if items, ok := seqItems(td); !ok || len(items) > 0 {
			names := make([]string, 0, 4)
			for _, it := range items {
				if s, ok := it.(string); ok && len(names) < 4 {
					names = append(names, s)
				}
			}
			return storageInfo{}, fmt.Errorf("%w: key %q is stored through transforms %v", ErrUnsupportedTransform, fqn, names)
		}
	}
	var info storageInfo
	pathV, err := attr(o, "relative_path")
	if err != nil {
		return info, err
	}
	path, ok := pathV.(string)
	if !ok {
		return info, malformed("storage_data %q relative_path is %s", fqn, typeName(pathV))
	}
	if err := keys.Validate(path); err != nil {
		return info, fmt.Errorf("%w: storage_data %q: %w", ErrMalformed, fqn, err)
	}
	offV, err := attr(o, "offset")
	if err != nil {
		return info, err
	}
	lenV, err := attr(o, "length")
	if err != nil {
		return info, err
	}
	off, ok1 := offV.(int64)
	n, ok2 := lenV.(int64)
	if !ok1 || !ok2 || off < 0 || n < 0 || off > (1<<62)-n {
		return info, malformed("storage_data %q range (%v, %v)", fqn, offV, lenV)
	}
	return storageInfo{path: path, offset: off, length: n}, nil
}

// lookup finds the storage of a tensor chunk (offsets != nil, possibly
// empty for a 0-dim tensor) or of a bytes item (offsets == nil). A writer
// that left out chunk offsets is tolerated when the key has exactly one
// chunk and one storage entry.
func (s *storageIndex) lookup(fqn string, offsets []int64, chunk, nchunks int) (storageInfo, error) {
	tensor := offsets != nil
	if info, ok := s.byKey[indexKey(fqn, offsets, tensor)]; ok {
		return info, nil
	}
	if tensor && nchunks == 1 && len(s.byFQN[fqn]) == 1 {
		if info, ok := s.byKey[indexKey(fqn, nil, false)]; ok {
			return info, nil
		}
	}
	if tensor {
		return storageInfo{}, malformed("no storage_data for %q chunk %d at offsets %v", fqn, chunk, offsets)
	}
	return storageInfo{}, malformed("no storage_data for bytes item %q", fqn)
}

// object checks that v is an instance of the DCP class name.
func object(v any, class string) (*pyObject, error) {
	o, ok := v.(*pyObject)
	if !ok || o.class.name != class {
		return nil, malformed("want a %s, got %s", class, typeName(v))
	}
	return o, nil
}

// optAttr returns a dataclass field: the instance attribute the BUILDs
// set (see unpickler.build).
func optAttr(o *pyObject, name string) (any, bool) {
	if o.fields == nil {
		return nil, false
	}
	return o.fields.get(name)
}

func attr(o *pyObject, name string) (any, error) {
	v, ok := optAttr(o, name)
	if !ok {
		return nil, malformed("%s has no field %q", o.class.name, name)
	}
	return v, nil
}

func dictAttr(o *pyObject, name string) (*pyDict, error) {
	v, err := attr(o, name)
	if err != nil {
		return nil, err
	}
	d, ok := v.(*pyDict)
	if !ok {
		return nil, malformed("%s.%s is %s, want a dict", o.class.name, name, typeName(v))
	}
	return d, nil
}

// worldSize is one more than the highest rank in "__<rank>_<n>.distcp"
// file names (0 when no name has that form). In torch 1.13 only the
// coordinator writes unsharded items, so this is a lower bound.
func worldSize(files map[string]int64) int {
	ws := 0
	for f := range files {
		base := f[strings.LastIndex(f, "/")+1:]
		if !strings.HasPrefix(base, "__") || !strings.HasSuffix(base, ".distcp") {
			continue
		}
		rank, _, ok := strings.Cut(strings.TrimSuffix(base[2:], ".distcp"), "_")
		if !ok {
			continue
		}
		if r, err := strconv.Atoi(rank); err == nil && r >= 0 && r < 1<<20 && r+1 > ws {
			ws = r + 1
		}
	}
	return ws
}

// training infers the training-state record from key names. As for the
// native format, any key under the optimizer prefix means the optimizer
// was saved: a save before the first optimizer step holds its param groups
// ("optimizer.param_groups.<i>.*") and no state at all, every parameter
// lazily absent, which a resume with the optimizer accepts.
func training(c *metadata.Checkpoint) metadata.TrainingState {
	ts := metadata.TrainingState{
		Optimizer:       metadata.OptimizerNone,
		OptimizerPrefix: OptimizerPrefix,
		ModelPrefix:     ModelPrefix,
	}
	statePrefix := statedict.StatePrefix(OptimizerPrefix)
	slots := map[string]bool{}
	anyOpt := false
	visit := func(key string) {
		anyOpt = anyOpt || strings.HasPrefix(key, OptimizerPrefix+".")
		if rest, ok := strings.CutPrefix(key, statePrefix); ok {
			ts.OptimizerStateEntries++
			if i := strings.LastIndexByte(rest, '.'); i >= 0 && i < len(rest)-1 {
				slots[rest[i+1:]] = true
			}
		}
		if strings.HasPrefix(key, SchedulerPrefix+".") {
			ts.SchedulerPrefix = SchedulerPrefix
		}
	}
	for _, t := range c.Tensors {
		visit(t.Key)
	}
	for _, b := range c.Bytes {
		visit(b.Key)
	}
	if anyOpt {
		ts.Optimizer = metadata.OptimizerSaved
	}
	for s := range slots {
		ts.OptimizerSlots = append(ts.OptimizerSlots, s)
	}
	sort.Strings(ts.OptimizerSlots)
	return ts
}

// ItemReader reads length bytes at offset of a data object of the
// checkpoint (key relative to its prefix).
type ItemReader func(object string, offset, length int64) ([]byte, error)

// FillIteration sets c.Training.Iteration from the bytes entry "iteration",
// or else "step", when it holds a Python int. DecodeMetadata cannot do this
// itself because DCP's metadata holds no values. It reports whether an
// iteration was found; a missing, opaque or non-int entry is not an error,
// but one whose pickle names a forbidden global is (ErrForbiddenGlobal).
func FillIteration(c *metadata.Checkpoint, read ItemReader) (bool, error) {
	for _, key := range []string{"iteration", "step"} {
		b := c.BytesValue(key)
		if b == nil || b.Encoding != EncodingBytes {
			continue
		}
		item, err := read(b.Object, b.Offset, b.Length)
		if err != nil {
			return false, fmt.Errorf("read %q: %w", key, err)
		}
		v, err := DecodeValue(item)
		if errors.Is(err, ErrOpaque) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("decode %q: %w", key, err)
		}
		if n, ok := v.(int64); ok {
			c.Training.Iteration = n
			return true, nil
		}
	}
	return false, nil
}

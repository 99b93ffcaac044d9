package torchdcp

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
)

// MaxBroadcastFactor bounds how far a tensor with overlapping strides (for
// example an expanded, stride-0 tensor) may grow when made contiguous: its
// row-major bytes may exceed its stored storage only up to this many times
// the item's size. Ordinary tensors never exceed their storage.
const MaxBroadcastFactor = 64

// archive is an opened torch.save zip: its top folder and entries by name.
type archive struct {
	size  int64
	dir   string // "archive" for torch.save, the file stem for other writers
	files map[string]*zip.File
}

// openArchive opens a torch.save zip from an item's bytes and locates its
// "<dir>/data.pkl" without assuming the folder name.
func openArchive(item []byte) (*archive, error) {
	// torch.load takes an item that does not start with a zip local file
	// header for a legacy torch.save stream (pickles it unpickles in
	// full), whatever zip directory it may end with.
	if !bytes.HasPrefix(item, zipMagic) {
		return nil, malformed("item does not start with a zip local file header (torch.load would read it as a legacy pickle stream)")
	}
	zr, err := zip.NewReader(bytes.NewReader(item), int64(len(item)))
	if err != nil {
		return nil, fmt.Errorf("%w: not a torch.save zip archive: %v", ErrMalformed, err)
	}
	a := &archive{size: int64(len(item)), files: make(map[string]*zip.File, len(zr.File))}
	for _, f := range zr.File {
		if _, dup := a.files[f.Name]; dup {
			return nil, malformed("zip entry %q appears twice", f.Name)
		}
		a.files[f.Name] = f
		dir, rest, ok := strings.Cut(f.Name, "/")
		if ok && rest == "data.pkl" && dir != "" {
			if a.dir != "" {
				return nil, malformed("zip holds two data.pkl entries (%q and %q)", a.dir, dir)
			}
			a.dir = dir
		}
	}
	if a.dir == "" {
		return nil, malformed("zip has no <folder>/data.pkl entry")
	}
	return a, nil
}

// read returns an entry's bytes; missing entries give (nil, false, nil).
// Only stored (uncompressed) entries no larger than the item are read, and
// archive/zip checks each entry's CRC-32 at its end (unless the archive
// records none: CRC-32 0).
func (a *archive) read(name string) ([]byte, bool, error) {
	f, ok := a.files[name]
	if !ok {
		return nil, false, nil
	}
	if f.Method != zip.Store {
		return nil, true, malformed("zip entry %q uses compression method %d; torch.save stores entries", name, f.Method)
	}
	if f.UncompressedSize64 > uint64(a.size) {
		return nil, true, malformed("zip entry %q claims %d bytes in a %d-byte item", name, f.UncompressedSize64, a.size)
	}
	buf := make([]byte, int(f.UncompressedSize64))
	if f.CRC32 == 0 {
		// torch >= 2.7 with torch.utils.serialization.config.save.
		// compute_crc32 = False records CRC-32 0 for every entry: there is
		// no checksum to verify (archive/zip would report a mismatch against
		// the data descriptor's 0). The bytes of a stored entry are read as
		// they are; the item's own CRC32C, when the checkpoint has one,
		// still covers them.
		if f.CompressedSize64 != f.UncompressedSize64 {
			return nil, true, malformed("stored zip entry %q: %d bytes stored for %d", name, f.CompressedSize64, f.UncompressedSize64)
		}
		r, err := f.OpenRaw()
		if err != nil {
			return nil, true, fmt.Errorf("%w: zip entry %q: %v", ErrMalformed, name, err)
		}
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, true, fmt.Errorf("%w: zip entry %q: %v", ErrMalformed, name, err)
		}
		return buf, true, nil
	}
	rc, err := f.Open()
	if err != nil {
		return nil, true, fmt.Errorf("%w: zip entry %q: %v", ErrMalformed, name, err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, buf); err != nil {
		return nil, true, fmt.Errorf("%w: zip entry %q: %v", ErrMalformed, name, err)
	}
	// Reading to EOF makes archive/zip verify the CRC-32.
	if _, err := rc.Read(make([]byte, 1)); err != io.EOF {
		return nil, true, fmt.Errorf("%w: zip entry %q: size or checksum mismatch (%v)", ErrMalformed, name, err)
	}
	return buf, true, nil
}

// noCRC32 reports whether the archive records no CRC-32 for its entries
// (torch >= 2.7 saving with compute_crc32 = False writes 0 for every
// entry; an empty entry's CRC-32 is 0 anyway and says nothing).
func (a *archive) noCRC32() bool {
	for _, f := range a.files {
		if f.UncompressedSize64 > 0 {
			return f.CRC32 == 0
		}
	}
	return false
}

// recordsNoCRC32 reports whether the checkpoint's torch.save items record
// no CRC-32 (torch's compute_crc32 is one setting per save, so the first
// torch.save bytes item, read through read, tells).
func recordsNoCRC32(c *metadata.Checkpoint, read ItemReader) (bool, error) {
	for _, b := range c.Bytes {
		if b.Encoding != EncodingBytes {
			continue
		}
		item, err := read(b.Object, b.Offset, b.Length)
		if err != nil {
			return false, fmt.Errorf("read %q: %w", b.Key, err)
		}
		a, err := openArchive(item)
		if err != nil {
			continue // not a torch.save archive (a raw bytes value)
		}
		return a.noCRC32(), nil
	}
	return false, nil
}

// pickle returns the archive's data.pkl.
func (a *archive) pickle() ([]byte, error) {
	b, _, err := a.read(a.dir + "/data.pkl")
	return b, err
}

// bigEndian reports whether the archive declares big-endian storages
// (torch >= 2.1 writes "<dir>/byteorder"; older archives are little-endian).
func (a *archive) bigEndian() (bool, error) {
	b, ok, err := a.read(a.dir + "/byteorder")
	if err != nil || !ok {
		return false, err
	}
	switch strings.TrimSpace(string(b)) {
	case "little":
		return false, nil
	case "big":
		return true, nil
	}
	return false, malformed("byteorder entry %q", b)
}

// storageLoader returns the persistent_load of a torch.save pickle: it
// accepts ('storage', <StorageClass>, key, location, numel) ids and records
// each storage.
func storageLoader() func(any) (any, error) {
	return func(pid any) (any, error) {
		t, ok := pid.(pyTuple)
		if !ok || len(t) != 5 {
			return nil, malformed("persistent id is %s, want a 5-tuple", typeName(pid))
		}
		if tag, _ := t[0].(string); tag != "storage" {
			return nil, malformed("persistent id tag %v, want 'storage'", t[0])
		}
		cls, ok := t[1].(*pyGlobal)
		if !ok || cls.kind != kindStorage {
			return nil, malformed("persistent id storage class is %s", typeName(t[1]))
		}
		key, ok1 := t[2].(string)
		loc, ok2 := t[3].(string)
		numel, ok3 := t[4].(int64)
		if !ok1 || !ok2 || !ok3 || numel < 0 || key == "" {
			return nil, malformed("persistent id fields (key %s, location %s, numel %s)", typeName(t[2]), typeName(t[3]), typeName(t[4]))
		}
		return &storageRef{dtype: cls.dtype, key: key, location: loc, numel: numel}, nil
	}
}

// DecodeTensor decodes one DCP tensor item: a complete torch.save archive of
// a single tensor. It returns the ckptkit dtype name (from the storage
// class), the shape and the row-major, contiguous, little-endian element
// bytes, honouring storage_offset and strides (a transposed tensor comes out
// row-major). Malformed input gives an ErrMalformed error, never a panic.
func DecodeTensor(item []byte) (dtype string, shape []int64, raw []byte, err error) {
	a, err := openArchive(item)
	if err != nil {
		return "", nil, nil, err
	}
	pkl, err := a.pickle()
	if err != nil {
		return "", nil, nil, err
	}
	v, err := unpickle(pkl, storageLoader())
	if err != nil {
		return "", nil, nil, fmt.Errorf("tensor pickle: %w", err)
	}
	t, ok := v.(*tensorRef)
	if !ok {
		return "", nil, nil, malformed("tensor item holds %s, not a tensor", typeName(v))
	}
	raw, err = a.materialize(t)
	if err != nil {
		return "", nil, nil, err
	}
	return t.storage.dtype, t.size, raw, nil
}

// materialize reads a tensor's storage and lays its elements out row-major.
func (a *archive) materialize(t *tensorRef) ([]byte, error) {
	es := metadata.ElementSize(t.storage.dtype)
	st, ok, err := a.read(a.dir + "/data/" + t.storage.key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, malformed("storage %q is missing from the archive", t.storage.key)
	}
	if t.storage.numel > int64(len(st)) || int64(len(st)) != t.storage.numel*es {
		return nil, malformed("storage %q holds %d bytes, want %d elements of %s", t.storage.key, len(st), t.storage.numel, t.storage.dtype)
	}
	numel, ok := checkedNumel(t.size)
	if !ok {
		return nil, malformed("tensor shape %v is invalid", t.size)
	}
	if numel > (1<<62)/es {
		return nil, malformed("tensor shape %v is too large", t.size)
	}
	nbytes := numel * es
	if nbytes > int64(len(st)) && nbytes > MaxBroadcastFactor*a.size {
		return nil, malformed("tensor of %d bytes expands a %d-byte item more than %d-fold", nbytes, a.size, MaxBroadcastFactor)
	}
	out, err := gather(st, es, t.offset, t.size, t.stride, numel)
	if err != nil {
		return nil, err
	}
	big, err := a.bigEndian()
	if err != nil {
		return nil, err
	}
	if big {
		unit := es
		if t.storage.dtype == "complex64" {
			unit = 4
		}
		swapBytes(out, int(unit))
	}
	return out, nil
}

// checkedNumel multiplies a shape, refusing negative dims and overflow.
func checkedNumel(shape []int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d != 0 && n > (1<<62)/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// gather copies the elements of a strided view of storage into row-major
// order. Every index the view can touch is bounds-checked first.
func gather(st []byte, es, offset int64, size, stride []int64, numel int64) ([]byte, error) {
	out := make([]byte, numel*es)
	if numel == 0 {
		return out, nil
	}
	storageNumel := int64(len(st)) / es
	maxIdx := offset
	for d := range size {
		if stride[d] < 0 {
			return nil, malformed("negative stride %v", stride)
		}
		if size[d] > 1 && stride[d] > 0 {
			if stride[d] > (1<<62)/(size[d]-1) {
				return nil, malformed("stride %v overflows", stride)
			}
			maxIdx += (size[d] - 1) * stride[d]
			if maxIdx >= 1<<62 {
				return nil, malformed("stride %v overflows", stride)
			}
		}
	}
	if maxIdx >= storageNumel {
		return nil, malformed("view (offset %d, size %v, stride %v) reads element %d of a %d-element storage", offset, size, stride, maxIdx, storageNumel)
	}
	if isContiguous(size, stride) {
		copy(out, st[offset*es:(offset+numel)*es])
		return out, nil
	}
	rank := len(size)
	inner, innerStride := size[rank-1], stride[rank-1]
	idx := make([]int64, rank-1)
	pos := int64(0)
	for {
		base := offset
		for d, i := range idx {
			base += i * stride[d]
		}
		if innerStride == 1 {
			copy(out[pos:pos+inner*es], st[base*es:(base+inner)*es])
			pos += inner * es
		} else {
			for i := int64(0); i < inner; i++ {
				e := (base + i*innerStride) * es
				copy(out[pos:pos+es], st[e:e+es])
				pos += es
			}
		}
		d := rank - 2
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return out, nil
		}
	}
}

// isContiguous reports whether stride is the row-major stride of size
// (dimensions of size 1 may have any stride).
func isContiguous(size, stride []int64) bool {
	want := int64(1)
	for d := len(size) - 1; d >= 0; d-- {
		if size[d] != 1 && stride[d] != want {
			return false
		}
		want *= size[d]
	}
	return true
}

func swapBytes(b []byte, unit int) {
	if unit <= 1 {
		return
	}
	for i := 0; i+unit <= len(b); i += unit {
		for l, r := i, i+unit-1; l < r; l, r = l+1, r-1 {
			b[l], b[r] = b[r], b[l]
		}
	}
}

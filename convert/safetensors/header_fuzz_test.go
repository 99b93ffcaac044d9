package safetensors

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// fuzzItems builds the items of a file from fuzz input: one tensor per
// line of names, dtypes in turn, each shape taken from dims (a rank byte,
// then that many dimension bytes).
func fuzzItems(names string, dims []byte) []item {
	dts := []statedict.DType{statedict.Float32, statedict.BFloat16, statedict.Int64, statedict.Bool, statedict.Complex64, statedict.Uint8}
	var items []item
	for i, name := range strings.Split(names, "\n") {
		if i == 16 {
			break
		}
		var shape []int64
		if len(dims) > 0 {
			rank := int(dims[0] % 4)
			dims = dims[1:]
			for ; rank > 0 && len(dims) > 0; rank-- {
				shape = append(shape, int64(dims[0]%8))
				dims = dims[1:]
			}
		}
		dt := dts[i%len(dts)]
		st, _ := DTypeName(dt)
		te := &metadata.TensorEntry{Key: name, DType: string(dt), Shape: shape}
		items = append(items, item{key: name, name: name, dtype: st, entry: te, size: statedict.NumElements(shape) * int64(dt.Size())})
	}
	return items
}

// FuzzHeader writes the safetensors header of arbitrary tensor names,
// shapes and metadata and parses it back from the format's specification:
// it must be 8-byte aligned JSON holding exactly each tensor, with its
// dtype, shape and offsets tiling the data section, and the metadata as
// given; a header that cannot say that (a name the format cannot hold)
// must be an error, never a file that says something else.
func FuzzHeader(f *testing.F) {
	f.Add("model.w\nmodel.b", []byte{2, 3, 4, 1, 5}, "pt")
	f.Add("a\n\nb\u202e\x00c", []byte{0, 3, 1, 2, 3}, "")
	f.Add("x", []byte{1, 0}, "\"quoted\"\\")
	f.Fuzz(func(t *testing.T, names string, dims []byte, meta string) {
		items := fuzzItems(names, dims)
		files := pack(items, 0)
		metaMap := map[string]string{"format": "pt", "ckptkit.note": meta}
		hdr, err := header(files[0].items, metaMap)
		if err != nil {
			seen := map[string]bool{}
			for _, it := range items {
				if it.name == metadataKey || !utf8.ValidString(it.name) || seen[it.name] {
					return // refused for a reason
				}
				seen[it.name] = true
			}
			t.Fatalf("header refused representable names %q: %v", names, err)
		}
		if len(hdr)%8 != 0 {
			t.Fatalf("header of %d bytes: the data would not be 8-byte aligned", len(hdr))
		}
		var fields map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(hdr))
		if err := dec.Decode(&fields); err != nil {
			t.Fatalf("header is not a JSON object: %v\n%q", err, hdr)
		}
		if len(fields) != len(items)+1 {
			t.Fatalf("%d tensors, header holds %d entries besides __metadata__: %q", len(items), len(fields)-1, hdr)
		}
		var gotMeta map[string]string
		if err := json.Unmarshal(fields[metadataKey], &gotMeta); err != nil || len(gotMeta) != 2 || gotMeta["ckptkit.note"] != meta && utf8.ValidString(meta) {
			t.Fatalf("metadata %s, want %v (%v)", fields[metadataKey], metaMap, err)
		}
		var end int64
		for _, it := range files[0].items {
			raw, ok := fields[it.name]
			if !ok {
				t.Fatalf("tensor %q missing from the header %q", it.name, hdr)
			}
			var e struct {
				DType       string  `json:"dtype"`
				Shape       []int64 `json:"shape"`
				DataOffsets []int64 `json:"data_offsets"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			want := it.entry.Shape
			if want == nil {
				want = []int64{}
			}
			if e.DType != it.dtype || !slices.Equal(e.Shape, want) || e.Shape == nil ||
				len(e.DataOffsets) != 2 || e.DataOffsets[0] != end || e.DataOffsets[1] != end+it.size {
				t.Fatalf("tensor %q: header says %s, want %s %v at [%d,%d)", it.name, raw, it.dtype, want, end, end+it.size)
			}
			end += it.size
		}
		if end != files[0].data {
			t.Fatalf("offsets cover %d bytes, the file holds %d", end, files[0].data)
		}
	})
}

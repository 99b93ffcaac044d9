package torchdcp

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptkit/ckptkit/metadata"
)

// fixtureItems returns a few real items (tensor and bytes) of the fixtures.
func fixtureItems(f *testing.F) [][]byte {
	dense, err := os.ReadFile(filepath.Join("testdata", "dense", "__0_0.distcp"))
	if err != nil {
		f.Fatal(err)
	}
	items := [][]byte{
		dense[0:431],            // optimizer.param_groups.0.lr (float)
		dense[431:862],          // betas (tuple)
		dense[3879 : 3879+495],  // params (list of str)
		dense[8253 : 8253+1259], // model.fc1.weight
		dense[9512 : 9512+811],  // model.fc1.bias
	}
	nested, err := os.ReadFile(filepath.Join("testdata", "nested_unflattened", "__0_1.distcp"))
	if err != nil {
		f.Fatal(err)
	}
	return append(items, nested)
}

// dataPickle extracts */data.pkl from a torch.save item.
func dataPickle(f *testing.F, item []byte) []byte {
	zr, err := zip.NewReader(bytes.NewReader(item), int64(len(item)))
	if err != nil {
		f.Fatal(err)
	}
	for _, zf := range zr.File {
		if filepath.Base(zf.Name) == "data.pkl" {
			rc, err := zf.Open()
			if err != nil {
				f.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			if err != nil {
				f.Fatal(err)
			}
			return b
		}
	}
	f.Fatal("no data.pkl")
	return nil
}

func FuzzUnpickle(f *testing.F) {
	for _, c := range fixtureCases {
		b, err := os.ReadFile(filepath.Join("testdata", c, ".metadata"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(metadata2x(nil))
	f.Add(metadata2x([]string{"stream_zstd"}))
	for _, item := range fixtureItems(f) {
		f.Add(dataPickle(f, item))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if v, err := unpickle(data, storageLoader()); err == nil {
			budget := 4*len(data) + 64
			_, _ = plain(v, 0, &budget)
		}
		c, err := DecodeMetadata(data)
		if err != nil {
			return
		}
		// Whatever decodes must be a valid common-model checkpoint.
		if err := c.Validate(); err != nil {
			t.Fatalf("decoded metadata does not validate: %v", err)
		}
		if _, err := metadata.Encode(c); err != nil {
			t.Fatalf("decoded metadata does not encode: %v", err)
		}
	})
}

func FuzzDecodeTensor(f *testing.F) {
	for _, item := range fixtureItems(f) {
		f.Add(item)
	}
	f.Fuzz(func(t *testing.T, item []byte) {
		dt, shape, raw, err := DecodeTensor(item)
		if err == nil {
			n, ok := checkedNumel(shape)
			if !ok || int64(len(raw)) != n*metadata.ElementSize(dt) {
				t.Fatalf("%s %v: %d bytes", dt, shape, len(raw))
			}
			if int64(len(raw)) > MaxBroadcastFactor*int64(len(item)) {
				t.Fatalf("%d output bytes from a %d-byte item", len(raw), len(item))
			}
		}
		_, _ = DecodeValue(item)
		_, _ = decodeBytesItem(item, "", nil)
	})
}

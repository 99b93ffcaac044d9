package torchdcp

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pk assembles pickles opcode by opcode for tests.
type pk struct{ b []byte }

func newPickle(proto byte) *pk { return &pk{b: []byte{opProto, proto}} }

func (p *pk) op(ops ...byte) *pk { p.b = append(p.b, ops...); return p }

func (p *pk) str(s string) *pk {
	if len(s) < 256 {
		p.b = append(p.b, opShortBinUni, byte(len(s)))
	} else {
		p.b = append(p.b, opBinUnicode)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	}
	p.b = append(p.b, s...)
	return p
}

func (p *pk) int(n int64) *pk {
	switch {
	case n >= 0 && n < 256:
		p.b = append(p.b, opBinInt1, byte(n))
	case n >= math.MinInt32 && n <= math.MaxInt32:
		p.b = append(p.b, opBinInt)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(n)))
	default:
		p.b = append(p.b, opLong1, 8)
		p.b = binary.LittleEndian.AppendUint64(p.b, uint64(n))
	}
	return p
}

func (p *pk) float(f float64) *pk {
	p.b = append(p.b, opBinFloat)
	p.b = binary.BigEndian.AppendUint64(p.b, math.Float64bits(f))
	return p
}

// global emits a protocol-2 GLOBAL.
func (p *pk) global(module, name string) *pk {
	p.b = append(p.b, opGlobal)
	p.b = append(p.b, module+"\n"+name+"\n"...)
	return p
}

// sglobal emits a protocol-4 STACK_GLOBAL.
func (p *pk) sglobal(module, name string) *pk {
	return p.str(module).str(name).op(opStackGlobal)
}

// ints emits a tuple of ints.
func (p *pk) ints(v ...int64) *pk {
	p.op(opMark)
	for _, n := range v {
		p.int(n)
	}
	return p.op(opTuple)
}

// size emits torch.Size(v).
func (p *pk) size(v ...int64) *pk {
	p.sglobal("torch", "Size")
	p.ints(v...)
	return p.op(opTuple1, opReduce)
}

func (p *pk) stop() []byte { return append(p.b, opStop) }

// tensorPickle is the data.pkl torch.save writes for one tensor.
func tensorPickle(storageClass string, numel, offset int64, size, stride []int64) []byte {
	p := newPickle(2).global("torch._utils", "_rebuild_tensor_v2").op(opMark)
	p.op(opMark).str("storage").global("torch", storageClass).str("0").str("cpu").int(numel).op(opTuple, opBinPersID)
	p.int(offset).ints(size...).ints(stride...).op(opNewFalse)
	p.global("collections", "OrderedDict").op(opEmptyTuple, opReduce)
	p.op(opTuple, opReduce)
	return p.stop()
}

// torchSave builds a torch.save-style zip (stored entries) under dir.
func torchSave(t testing.TB, dir string, pkl []byte, storages map[string][]byte, extra map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(name string, data []byte) {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Store})
		require.NoError(t, err)
		_, err = w.Write(data)
		require.NoError(t, err)
	}
	add(dir+"/data.pkl", pkl)
	for k, v := range storages {
		add(dir+"/data/"+k, v)
	}
	for k, v := range extra {
		if name, ok := strings.CutPrefix(k, "/"); ok {
			add(name, v) // outside dir
			continue
		}
		add(dir+"/"+k, v)
	}
	add(dir+"/version", []byte("3\n"))
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func float32s(v ...float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, f := range v {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
	}
	return out
}

package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/ckptkit/ckptkit/statedict"
)

// TensorSpec is one tensor of the synthetic model: key and float32 shape.
type TensorSpec struct {
	Key   string  `json:"key"`
	Shape []int64 `json:"shape"`
}

// numLayers is the number of transformer-like blocks of the synthetic model;
// with the embedding that makes 1 + 8*24 = 193 tensors.
const numLayers = 24

// modelSpec returns 193 float32 tensors of mixed sizes (an embedding, then
// per block qkv/proj/fc1/fc2 weights and biases) totalling about size bytes.
// The hidden size h is chosen so that 24*12*h^2 (block weights) plus the
// 8h x h embedding, in float32, is close to size.
func modelSpec(size int64) []TensorSpec {
	h := int64(math.Sqrt(float64(size) / 4 / (numLayers*12 + 8)))
	h = max(8, h/8*8)
	specs := []TensorSpec{{Key: "model.embed.weight", Shape: []int64{8 * h, h}}}
	for l := 0; l < numLayers; l++ {
		p := fmt.Sprintf("model.layers.%02d.", l)
		specs = append(specs,
			TensorSpec{p + "attn.qkv.weight", []int64{3 * h, h}},
			TensorSpec{p + "attn.qkv.bias", []int64{3 * h}},
			TensorSpec{p + "attn.proj.weight", []int64{h, h}},
			TensorSpec{p + "attn.proj.bias", []int64{h}},
			TensorSpec{p + "mlp.fc1.weight", []int64{4 * h, h}},
			TensorSpec{p + "mlp.fc1.bias", []int64{4 * h}},
			TensorSpec{p + "mlp.fc2.weight", []int64{h, 4 * h}},
			TensorSpec{p + "mlp.fc2.bias", []int64{h}},
		)
	}
	return specs
}

// specBytes is the total float32 byte size of specs.
func specBytes(specs []TensorSpec) int64 {
	var n int64
	for _, s := range specs {
		n += statedict.NumElements(s.Shape) * 4
	}
	return n
}

// fillRandom writes pseudo-random bytes (incompressible, so no storage can
// shortcut them) derived from seed into b.
func fillRandom(b []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	for ; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
}

// sourceState builds the full tensors of specs, filled with random bytes,
// and their row shards over world ranks (the shards share the tensors'
// memory).
func sourceState(specs []TensorSpec, world int) []*statedict.StateDict {
	sds := make([]*statedict.StateDict, world)
	for r := range sds {
		sds[r] = statedict.New()
	}
	for i, s := range specs {
		t := statedict.NewTensor(statedict.Float32, s.Shape...)
		fillRandom(t.Data, uint64(i)+1)
		for r := range sds {
			sds[r].Tensors[s.Key] = statedict.RowShard(t, r, world)
		}
	}
	return sds
}

// targetState allocates, per rank of world, the row shard of every tensor
// of specs (only the shard's bytes, not the whole tensor), with every page
// touched so that the buffers are resident before anything is measured.
func targetState(specs []TensorSpec, world int) []*statedict.StateDict {
	sds := make([]*statedict.StateDict, world)
	for r := range sds {
		sds[r] = statedict.New()
		for _, s := range specs {
			lo, hi := statedict.SplitRange(s.Shape[0], r, world)
			sizes := append([]int64{hi - lo}, s.Shape[1:]...)
			offs := make([]int64, len(s.Shape))
			offs[0] = lo
			data := make([]byte, statedict.NumElements(sizes)*4)
			for p := 0; p < len(data); p += 4096 {
				data[p] = 1
			}
			sds[r].Tensors[s.Key] = &statedict.Shard{DType: statedict.Float32, GlobalShape: append([]int64(nil), s.Shape...),
				Offsets: offs, Sizes: sizes, Data: data}
		}
	}
	return sds
}

// Package ckpttest holds test helpers shared by the operation packages
// (catalog, ops/*, convert/*): the backends a test runs on, a deterministic
// sharded training state, and saving it under a run. Only tests import it.
package ckpttest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"  // file:// for tests
	_ "github.com/ckptkit/ckptkit/backend/gcs" // gs:// when CKPTKIT_TEST_GCS_URL is set
	_ "github.com/ckptkit/ckptkit/backend/mem" // mem:// for tests
	_ "github.com/ckptkit/ckptkit/backend/s3"  // s3:// when CKPTKIT_TEST_S3_URL is set
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// S3URLEnv names the environment variable scripts/test-servers.sh exports
// with the URL of a test S3 bucket.
const S3URLEnv = "CKPTKIT_TEST_S3_URL"

// GCSURLEnv names the environment variable scripts/test-servers.sh exports
// with the URL of a test GCS bucket on the emulator (whose address is
// STORAGE_EMULATOR_HOST).
const GCSURLEnv = "CKPTKIT_TEST_GCS_URL"

// Backend is a storage a test runs on.
type Backend struct {
	Name string
	// Open returns a Store on a fresh, empty prefix, closed at cleanup.
	Open func(t testing.TB) *backend.Store
}

var seq atomic.Int64

// Backends returns fs (a temp dir), mem (a fresh named bucket) and, when
// CKPTKIT_TEST_S3_URL is set, s3 (a fresh prefix in the test bucket).
func Backends(t testing.TB) []Backend {
	bs := []Backend{
		{Name: "fs", Open: func(t testing.TB) *backend.Store {
			return OpenURL(t, "file://"+t.TempDir())
		}},
		{Name: "mem", Open: func(t testing.TB) *backend.Store {
			return OpenURL(t, fmt.Sprintf("mem://ckpttest-%d-%d/", os.Getpid(), seq.Add(1)))
		}},
	}
	raw := os.Getenv(S3URLEnv)
	if raw == "" {
		t.Logf("s3: skipped (%s not set)", S3URLEnv)
		return bs
	}
	return append(bs, scratchOn("s3", raw))
}

// scratchOn is the backend name whose stores are fresh prefixes below the
// URL raw.
func scratchOn(name, raw string) Backend {
	return Backend{Name: name, Open: func(t testing.TB) *backend.Store {
		root, err := backend.Open(context.Background(), raw)
		require.NoError(t, err)
		return storetest.Scratch(t, root)
	}}
}

// BackendsWithGCS is Backends plus, when CKPTKIT_TEST_GCS_URL is set, gcs
// (a fresh prefix in the emulator's test bucket).
func BackendsWithGCS(t testing.TB) []Backend {
	bs := Backends(t)
	raw := os.Getenv(GCSURLEnv)
	if raw == "" {
		t.Logf("gcs: skipped (%s not set)", GCSURLEnv)
		return bs
	}
	return append(bs, scratchOn("gcs", raw))
}

// OpenURL opens a store and closes it at cleanup.
func OpenURL(t testing.TB, raw string) *backend.Store { return storetest.Open(t, raw) }

// State is a deterministic training state: global tensors and bytes values.
type State struct {
	Tensors map[string]*statedict.Tensor
	Bytes   map[string][]byte
}

// NewState returns a small model (every dtype), AdamW state for its float32
// parameters and a scheduler value. rows scales the tensors' first
// dimension.
func NewState(seed uint64, rows int64) *State {
	s := &State{Tensors: map[string]*statedict.Tensor{}, Bytes: map[string][]byte{}}
	n := seed << 32
	fill := func(t *statedict.Tensor) *statedict.Tensor { n++; return detbytes.Tensor(t, n) }
	for _, dt := range statedict.DTypes() {
		s.Tensors["model.layer_"+string(dt)+".weight"] = fill(statedict.NewTensor(dt, rows, 3))
	}
	s.Tensors["model.embed.weight"] = fill(statedict.NewTensor(statedict.Float32, rows, 8))
	s.Tensors["model.scale"] = fill(statedict.NewTensor(statedict.Float32))
	for _, p := range []string{"embed.weight", "layer_float32.weight"} {
		w := s.Tensors["model."+p]
		opt := statedict.DefaultOptimizerPrefix
		s.Tensors[statedict.StateKey(opt, p, statedict.SlotStep)] = fill(statedict.NewTensor(statedict.Float32))
		s.Tensors[statedict.StateKey(opt, p, statedict.SlotExpAvg)] = fill(statedict.NewTensor(statedict.Float32, w.Shape...))
		s.Tensors[statedict.StateKey(opt, p, statedict.SlotExpAvgSq)] = fill(statedict.NewTensor(statedict.Float32, w.Shape...))
	}
	s.Bytes[statedict.ParamGroupKey(statedict.DefaultOptimizerPrefix, 0, "lr")] = []byte("0.001")
	s.Bytes["scheduler.last_epoch"] = []byte(fmt.Sprint(seed))
	return s
}

// Shard splits the state over world ranks: tensors with rows are split by
// rows, 0-dim tensors and bytes go to rank 0.
func (s *State) Shard(world int) []*statedict.StateDict {
	sds := make([]*statedict.StateDict, world)
	for r := range sds {
		sds[r] = statedict.New()
		for k, t := range s.Tensors {
			if len(t.Shape) == 0 {
				if r == 0 {
					sds[r].Tensors[k] = statedict.Whole(t)
				}
				continue
			}
			sds[r].Tensors[k] = statedict.RowShard(t, r, world)
		}
	}
	for k, b := range s.Bytes {
		sds[0].Bytes[k] = b
	}
	return sds
}

// Targets returns load targets with the keys and geometry of sds (one per
// rank): zero-filled tensor buffers, bytes keys with nil values.
func Targets(sds []*statedict.StateDict) []*statedict.StateDict {
	targets := make([]*statedict.StateDict, len(sds))
	for r, sd := range sds {
		targets[r] = statedict.New()
		for k, v := range sd.Tensors {
			targets[r].Tensors[k] = &statedict.Shard{DType: v.DType, GlobalShape: v.GlobalShape, Offsets: v.Offsets, Sizes: v.Sizes, Data: make([]byte, len(v.Data))}
		}
		for k := range sd.Bytes {
			targets[r].Bytes[k] = nil
		}
	}
	return targets
}

// Keys lists every key, sorted.
func (s *State) Keys() []string {
	var ks []string
	for k := range s.Tensors {
		ks = append(ks, k)
	}
	for k := range s.Bytes {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// SaveStep saves the state sharded over world ranks as run/step-NNNNNNNN.
func SaveStep(t testing.TB, run *backend.Store, step int64, s *State, world int) *backend.Store {
	t.Helper()
	st, err := run.Sub(catalog.StepName(step))
	require.NoError(t, err)
	_, err = saver.SaveLocal(context.Background(), st, s.Shard(world), saver.Options{Iteration: step})
	require.NoError(t, err)
	return st
}

// RequireLoads reads every key of the checkpoint at st through the loader
// and checks it against s bit for bit.
func RequireLoads(t testing.TB, st *backend.Store, s *State) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	for k, want := range s.Tensors {
		got, err := c.ReadTensor(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, want.DType, got.DType, k)
		require.Equal(t, fmt.Sprint(want.Shape), fmt.Sprint(got.Shape), k)
		require.Equal(t, want.Data, got.Data, k)
	}
	for k, want := range s.Bytes {
		got, err := c.ReadBytes(ctx, k)
		require.NoError(t, err, k)
		require.Equal(t, want, got, k)
	}
}

package conformance

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/interop/torchdcp" // registers the DCP format with the loader
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/statedict"
)

// dcpFixtures are real PyTorch DCP checkpoints (testdata/dcp/README.md),
// embedded so the dcp cases run wherever the suite runs and never skip.
//
//go:embed all:testdata/dcp
var dcpFixtures embed.FS

// dcpRoot is the folder of dcpFixtures holding one folder per checkpoint.
const dcpRoot = "testdata/dcp"

// dcpMetadataKey is the commit object of a DCP checkpoint.
const dcpMetadataKey = ".metadata"

// dcpManifest is what a DCP fixture must load as (from its manifest.json).
type dcpManifest struct {
	Source     string   `json:"source"`
	Iteration  int64    `json:"iteration"`
	LazyParams []string `json:"lazy_params"`
	// LazySlots are, per lazily-absent parameter, the slots (name: shape)
	// its optimizer gives it, when they are not AdamW's (dcpSlots).
	LazySlots  map[string]map[string][]int64 `json:"lazy_slots"`
	AbsentKeys []string                      `json:"absent_keys"`
	Partial    *struct {
		Param   string   `json:"param"`
		Present []string `json:"present"`
		Missing []string `json:"missing"`
	} `json:"partial"`
	Keys []struct {
		Key    string  `json:"key"`
		Kind   string  `json:"kind"`
		DType  string  `json:"dtype"`
		Shape  []int64 `json:"shape"`
		SHA256 string  `json:"sha256"`
	} `json:"keys"`
}

// dcpSlots are the AdamW slots torch writes for a parameter.
var dcpSlots = statedict.AdamWSlots()

// putDCP writes the embedded checkpoint name object by object through st,
// its .metadata last (the commit point), and returns its manifest.
func putDCP(t T, st *backend.Store, name string) *dcpManifest {
	t.Helper()
	ctx := t.Context()
	dir := path.Join(dcpRoot, name)
	raw, err := dcpFixtures.ReadFile(path.Join(dir, "manifest.json"))
	require.NoError(t, err)
	var m dcpManifest
	require.NoError(t, json.Unmarshal(raw, &m), "manifest of %s", name)
	ents, err := fs.ReadDir(dcpFixtures, dir)
	require.NoError(t, err)
	var objects []string
	for _, e := range ents {
		if n := e.Name(); n == dcpMetadataKey || strings.HasSuffix(n, ".distcp") {
			objects = append(objects, n)
		}
	}
	sort.Slice(objects, func(i, j int) bool { return objects[j] == dcpMetadataKey && objects[i] != dcpMetadataKey })
	require.Equal(t, dcpMetadataKey, objects[len(objects)-1], "fixture %s has a .metadata", name)
	for _, o := range objects {
		data, err := dcpFixtures.ReadFile(path.Join(dir, o))
		require.NoError(t, err)
		require.NoError(t, st.PutBytes(ctx, o, data, backend.PutOptions{}), "copy %s/%s through %s", name, o, st)
	}
	return &m
}

// dcpTarget is a resuming job's load target for m: every saved key, plus
// every AdamW slot of each lazily-absent parameter (a job builds optimizer
// state for every trainable parameter), all tensors filled with a "fresh
// state" pattern and bytes values nil.
func dcpTarget(t T, m *dcpManifest) *statedict.StateDict {
	t.Helper()
	sd := statedict.New()
	shapes := map[string][]int64{}
	for i, k := range m.Keys {
		switch k.Kind {
		case "tensor":
			sd.Tensors[k.Key] = statedict.Whole(detbytes.Tensor(statedict.NewTensor(statedict.DType(k.DType), k.Shape...), uint64(i)+1))
			shapes[k.Key] = k.Shape
		default:
			sd.Bytes[k.Key] = nil
		}
	}
	for i, p := range m.LazyParams {
		shape, ok := shapes["model."+p]
		require.True(t, ok, "lazily-absent parameter %q is declared by the checkpoint (model key present)", p)
		for j, slot := range lazySlots(m, p) {
			tn := statedict.NewTensor(statedict.Float32)
			if s, ok := m.LazySlots[p][slot]; ok {
				tn = statedict.NewTensor(statedict.Float32, s...)
			} else if slot != statedict.SlotStep {
				tn = statedict.NewTensor(statedict.Float32, shape...)
			}
			sd.Tensors[statedict.StateKey(statedict.DefaultOptimizerPrefix, p, slot)] = statedict.Whole(detbytes.Tensor(tn, uint64(1000+10*i+j)))
		}
	}
	return sd
}

// lazySlots returns the slot names a resuming optimizer gives the lazily
// absent parameter p: the manifest's, else AdamW's.
func lazySlots(m *dcpManifest, p string) []string {
	if s, ok := m.LazySlots[p]; ok {
		names := make([]string, 0, len(s))
		for n := range s {
			names = append(names, n)
		}
		sort.Strings(names)
		return names
	}
	return dcpSlots
}

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// caseDCPLazy writes the DCP checkpoint name through the store, then
// checks it opens as DCP, verifies (deep) as resumable with its lazy state
// as information, and loads with one metadata read: every saved tensor bit
// for bit (SHA-256 as torch recorded it), every bytes value, the lazily
// absent parameters reported once each and their fresh state untouched.
func caseDCPLazy(name string) func(t T, h *Harness) {
	return func(t T, h *Harness) {
		ctx := context.Background()
		st := h.NewStore(t)
		m := putDCP(t, st, name)
		require.NotEmpty(t, m.LazyParams, "fixture %s has lazily-absent state", name)

		c, err := loader.Open(ctx, st)
		require.NoError(t, err, "open the DCP checkpoint copied through %s", st)
		require.Equal(t, torchdcp.FormatName, c.FormatName())

		vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
		require.NoError(t, err)
		require.True(t, vr.Resumable, "deep verify of %s (%s): %+v", name, m.Source, vr.Problems)
		require.Len(t, vr.Info, 1, "one information line: %+v", vr.Info)
		require.Equal(t, loader.RuleLazyOptimizer, vr.Info[0].Rule)
		for _, p := range m.LazyParams {
			assert.Contains(t, vr.Info[0].Message, p)
		}

		target := dcpTarget(t, m)
		before := target.Clone()
		counter := instrument.Wrap(st.Driver())
		rep, err := loader.Load(ctx, st.WithDriver(counter), []*statedict.StateDict{target}, quietLoad())
		require.NoError(t, err, "load %s (%s) with fresh state for every parameter", name, m.Source)
		require.Equal(t, int64(1), counter.CountKeySuffix(instrument.OpRead, dcpMetadataKey), "metadata must be read exactly once per load")
		require.Zero(t, counter.Count(instrument.OpPut), "a load writes nothing")
		got := slices.Clone(rep.LazyParams)
		sort.Strings(got)
		require.Equal(t, m.LazyParams, got, "every lazily-absent parameter reported exactly once")
		require.Equal(t, m.Iteration, rep.Iteration)
		require.True(t, rep.OptimizerLoaded)
		for _, p := range m.LazyParams {
			for _, slot := range lazySlots(m, p) {
				k := statedict.StateKey(statedict.DefaultOptimizerPrefix, p, slot)
				require.Equal(t, before.Tensors[k].Data, target.Tensors[k].Data, "%s must be left fresh", k)
			}
		}
		for _, k := range m.Keys {
			if k.Kind == "tensor" {
				require.Equal(t, k.SHA256, hexSHA256(target.Tensors[k.Key].Data), "SHA-256 of %s as loaded through %s", k.Key, st)
				continue
			}
			require.NotEmpty(t, target.Bytes[k.Key], "bytes value %s loaded", k.Key)
		}
	}
}

// caseDCPPartial writes a DCP checkpoint whose optimizer state is partial
// (resume rule 2) through the store: the load fails naming the parameter
// and the missing key, before touching the target or the store, and verify
// says not resumable.
func caseDCPPartial(t T, h *Harness) { caseDCPPartialOf("partial_optim")(t, h) }

// caseDCPPartialOf is caseDCPPartial on the embedded checkpoint name.
func caseDCPPartialOf(name string) func(t T, h *Harness) {
	return func(t T, h *Harness) { dcpPartial(t, h, name) }
}

func dcpPartial(t T, h *Harness, name string) {
	ctx := context.Background()
	st := h.NewStore(t)
	m := putDCP(t, st, name)
	require.NotNil(t, m.Partial, "fixture declares its partial state")
	target := dcpTarget(t, m)
	w := target.Tensors["model."+m.Partial.Param]
	require.NotNil(t, w, "the partial parameter is declared by the checkpoint")
	for i, k := range m.Partial.Missing {
		target.Tensors[k] = statedict.Whole(detbytes.Tensor(statedict.NewTensor(statedict.Float32, w.GlobalShape...), uint64(2000+i)))
	}
	before := target.Clone()
	objects := listing(t, st)
	_, err := loader.Load(ctx, st, []*statedict.StateDict{target}, quietLoad())
	require.ErrorIs(t, err, loader.ErrPartialOptimizerState)
	assert.Contains(t, err.Error(), m.Partial.Param)
	for _, k := range m.Partial.Missing {
		assert.Contains(t, err.Error(), k)
	}
	requireUnchanged(t, []*statedict.StateDict{before}, []*statedict.StateDict{target})
	require.Equal(t, objects, listing(t, st), "a failed load must not change the store")

	requireVerifyProblem(t, st, false, loader.RulePartialOptimizer)
}

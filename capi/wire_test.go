package main

import (
	"encoding/json"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/abi_golden.json")

// goldenPath is read by python/tests/test_abi.py too: the field names of
// every JSON document crossing the ABI, on both sides.
const goldenPath = "testdata/abi_golden.json"

// wireSamples is one document of each kind the C ABI returns, every field
// set (so that every name appears).
func wireSamples() map[string]any {
	rep := newLoadReport(&loader.Report{URL: "file:///r/step-00000010", Format: "native", Iteration: 10,
		OptimizerRecord: "adamw", OptimizerLoaded: true, LazyParams: []string{"model.b"}, LazyKeys: 2,
		SkippedOptimizerKeys: 1, FrozenMissing: []string{"model.f"}, ExtraKeys: []string{"extra"}, KeysLoaded: 7,
		BytesNeeded: 100, BytesRead: 200, ReadRequests: 3, Mode: loader.ModeDirect, Duration: 1500 * time.Millisecond})
	info := ckptInfo{URL: "file:///r/step-00000010", Name: "step-00000010", Step: 10, Format: "native", Iteration: 10,
		Optimizer: "adamw", Skipped: []skipped{{URL: "file:///r/step-00000011", Reason: "uncommitted"}}, None: true, Empty: true}
	rep.Bytes = []map[string][]byte{{"step": []byte("10")}}
	return map[string]any{
		// The ABI version, read by the Python binding's test too: bumped
		// with every incompatible change of an export's arguments.
		"abi_version":     abiVersion,
		"capabilities":    capabilitiesJSON{CreateIfAbsent: true, ServerCRC32C: true, Multipart: true, PartSize: 16 << 20, Concurrency: 8},
		"list_entry":      listEntry{Key: "a/b", Size: 5, MTimeNs: 1700000000000000000},
		"checkpoint_info": info,
		"load_report":     rep,
		"save_result": saveResult{URL: "file:///r/step-00000010", BytesWritten: 100, MetadataBytes: 10, Seconds: 1.5,
			StallSeconds: 0.5, WaitedSeconds: 0.25, StagingSeconds: 0.125, Warning: "cleanup"},
		"saver_stats": saverStatsJSON{BudgetBytes: 4, PoolBytes: 3, HeldBytes: 2, PeakBytes: 1},
		"load_info": loadInfo{URL: "file:///r/step-00000010", Name: "step-00000010", Step: 10, Format: "native", Iteration: 10,
			Optimizer: "adamw", OnePass: true},
		"resume_result": resumeResult{Fresh: true, Empty: true, URL: "file:///r/step-00000010", Name: "step-00000010", Step: 10,
			Iteration: 10, Skipped: []resumeSkip{{URL: "file:///r/step-00000012", Reason: "checksum", Why: "damaged"}},
			Tier: "local", TierWhy: "every rank's local copy verified"},
		"persist": persistOutcome{Step: 4, Retries: 1, Bytes: 100, Error: "persist failed"},
	}
}

func TestWireGolden(t *testing.T) {
	got, err := json.MarshalIndent(wireSamples(), "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	if *updateGolden {
		require.NoError(t, os.WriteFile(goldenPath, got, 0o644))
	}
	want, err := os.ReadFile(goldenPath)
	require.NoError(t, err, "run go test ./capi -run TestWireGolden -update")
	assert.JSONEq(t, string(want), string(got), "a field crossing the ABI changed its name: update %s (go test -update) and the Python binding", goldenPath)
}

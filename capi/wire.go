package main

import (
	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
)

// The JSON documents the C ABI returns. Every field crossing it has an
// explicit name here (never a Go field name: renaming one must not change
// the contract); testdata/abi_golden.json holds one of each, checked by
// TestWireGolden and by the Python binding's test_abi.py.

// capabilitiesJSON is what ckpt_capabilities returns.
type capabilitiesJSON struct {
	CreateIfAbsent bool  `json:"create_if_absent"`
	ServerCRC32C   bool  `json:"server_crc32c"`
	Multipart      bool  `json:"multipart"`
	PartSize       int64 `json:"part_size"`
	Concurrency    int   `json:"concurrency"`
}

func capabilitiesOf(c backend.Capabilities) capabilitiesJSON {
	return capabilitiesJSON{CreateIfAbsent: c.CreateIfAbsent, ServerCRC32C: c.ServerCRC32C, Multipart: c.Multipart,
		PartSize: c.PartSize, Concurrency: c.Concurrency}
}

// listEntry is one object of what ckpt_list returns.
type listEntry struct {
	Key     string `json:"key"`
	Size    int64  `json:"size"`
	MTimeNs int64  `json:"mtime_ns"`
}

// saverStatsJSON is what ckpt_saver_stats returns (saver.Stats).
type saverStatsJSON struct {
	BudgetBytes int64 `json:"budget_bytes"`
	PoolBytes   int64 `json:"pool_bytes"`
	HeldBytes   int64 `json:"held_bytes"`
	PeakBytes   int64 `json:"peak_bytes"`
}

func saverStatsOf(st saver.Stats) saverStatsJSON {
	return saverStatsJSON{BudgetBytes: st.BudgetBytes, PoolBytes: st.PoolBytes, HeldBytes: st.HeldBytes, PeakBytes: st.PeakBytes}
}

// saveResult is what ckpt_save_wait returns for a committed save.
type saveResult struct {
	URL           string  `json:"url"`
	BytesWritten  int64   `json:"bytes_written"`
	MetadataBytes int     `json:"metadata_bytes"`
	Seconds       float64 `json:"seconds"`
	StallSeconds  float64 `json:"stall_seconds"`
	WaitedSeconds float64 `json:"waited_seconds"`
	// StagingSeconds is how long the save read the caller's buffers
	// (saver.Handle.Staging): planning and the copy into the pool, most
	// of it after ckpt_saver_save returned with an overlap saver.
	StagingSeconds float64 `json:"staging_seconds"`
	Warning        string  `json:"warning,omitempty"`
}

// loadReport is what ckpt_checkpoint_load returns: loader.Report's figures
// under explicit names, the summary, the byte values and the fallbacks.
type loadReport struct {
	URL                  string   `json:"url"`
	Format               string   `json:"format"`
	Iteration            int64    `json:"iteration"`
	OptimizerRecord      string   `json:"optimizer_record"`
	OptimizerLoaded      bool     `json:"optimizer_loaded"`
	LazyParams           []string `json:"lazy_params"`
	LazyKeys             int      `json:"lazy_keys"`
	SkippedOptimizerKeys int      `json:"skipped_optimizer_keys"`
	FrozenMissing        []string `json:"frozen_missing"`
	ExtraKeys            []string `json:"extra_keys"`
	KeysLoaded           int      `json:"keys_loaded"`
	BytesNeeded          int64    `json:"bytes_needed"`
	BytesRead            int64    `json:"bytes_read"`
	ReadRequests         int      `json:"read_requests"`
	Mode                 string   `json:"mode"`
	Seconds              float64  `json:"seconds"`
	Summary              string   `json:"summary"`
	// Bytes are the bytes values loaded, per local rank, by key (for a
	// DCP checkpoint: JSON text, or the raw torch.save item for values
	// without a JSON form), base64 in the JSON.
	Bytes []map[string][]byte `json:"bytes"`
}

// newLoadReport is the wire form of rep.
func newLoadReport(rep *loader.Report) loadReport {
	return loadReport{URL: rep.URL, Format: rep.Format, Iteration: rep.Iteration, OptimizerRecord: rep.OptimizerRecord,
		OptimizerLoaded: rep.OptimizerLoaded, LazyParams: nonNilStrings(rep.LazyParams), LazyKeys: rep.LazyKeys,
		SkippedOptimizerKeys: rep.SkippedOptimizerKeys, FrozenMissing: nonNilStrings(rep.FrozenMissing),
		ExtraKeys: nonNilStrings(rep.ExtraKeys), KeysLoaded: rep.KeysLoaded, BytesNeeded: rep.BytesNeeded,
		BytesRead: rep.BytesRead, ReadRequests: rep.ReadRequests, Mode: rep.Mode, Seconds: rep.Duration.Seconds(),
		Summary: rep.Summary()}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Package planner turns what ranks hold into what gets written, and what a
// loader wants into what gets read. It is pure: no I/O, no goroutines.
//
// Save: every rank's LocalPlan -> one GlobalPlan (replicated items written
// once, writers balanced by bytes, chunks validated, objects assigned) ->
// the checkpoint's metadata skeleton (CRCs filled in by the saver).
//
// Load: the metadata plus the ranks' ReadRequests -> a LoadPlan of
// coalesced byte-range reads, each carrying the saved chunks it holds and
// where each chunk's intersection with each request goes.
package planner

import (
	"github.com/ckptkit/ckptkit/metadata"
)

// ItemKind says whether a save item is a tensor chunk or a byte value.
type ItemKind int

// Item kinds.
const (
	TensorItem ItemKind = iota
	BytesItem
)

// SaveItem is one thing a rank offers to save.
type SaveItem struct {
	Key  string
	Kind ItemKind
	// Tensor items: dtype name, global shape and the chunk box.
	DType       string
	GlobalShape []int64
	Offsets     []int64
	Sizes       []int64
	// Length is the item's byte length (for tensors numel(Sizes)*elemsize).
	Length int64
}

// LocalPlan is what one rank offers.
type LocalPlan struct {
	Rank  int
	Items []SaveItem
}

// WriteItem is a SaveItem assigned to a place in a data object. It holds
// the item's key and length; the rest of the item is the writing rank's
// LocalPlan.Items[LocalIndex] (an index, not a copy: a million items are
// planned without copying a million SaveItems).
type WriteItem struct {
	// Key and Length are the SaveItem's.
	Key    string
	Length int64
	// LocalIndex is the item's index in its rank's LocalPlan.Items.
	LocalIndex int
	// Object and Offset locate the item's bytes.
	Object string
	Offset int64
	// Entry and Chunk index the metadata this item fills: for tensors
	// Metadata.Tensors[Entry].Chunks[Chunk]; for bytes Metadata.Bytes[Entry]
	// (Chunk is -1).
	Entry int
	Chunk int
}

// RankWrites is what one rank writes into one object, in offset order.
type RankWrites struct {
	Rank   int
	Object string
	Size   int64
	Items  []WriteItem
}

// GlobalPlan is the result of PlanSave.
type GlobalPlan struct {
	// Writes holds one entry per object to write (a rank may own several or
	// none), sorted by object key.
	Writes []RankWrites
	// Metadata is the checkpoint skeleton: entries sorted, objects listed,
	// CRC32C fields zero until the saver fills them.
	Metadata *metadata.Checkpoint
}

// SaveOptions tune PlanSave.
type SaveOptions struct {
	// MaxObjectBytes splits a rank's writes into several objects when they
	// exceed it (0: one object per rank).
	MaxObjectBytes int64
	// ObjectName names a rank's n-th object (default "rank-%05d-%03d.data").
	ObjectName func(rank, n int) string
}

// ReadRequest is one box of one tensor that a loading rank wants, or a byte
// value (Kind BytesItem, geometry empty).
type ReadRequest struct {
	Key     string
	Kind    ItemKind
	DType   string
	Offsets []int64
	Sizes   []int64
}

// Copy moves the intersection of a saved chunk with a request: Box (global
// offsets and sizes) is inside both.
type Copy struct {
	Request int // index into the ReadRequests
	Offsets []int64
	Sizes   []int64
}

// ChunkRead is one saved chunk (or bytes entry) inside a ReadOp.
type ChunkRead struct {
	Key   string
	Entry int // index in Metadata.Tensors, or Metadata.Bytes for bytes
	Chunk int // chunk index, -1 for bytes
	// Start is the chunk's offset inside the ReadOp's buffer.
	Start  int64
	Length int64
	Copies []Copy
}

// ReadOp is one ranged read of an object: [Offset, Offset+Length), holding
// one or more whole chunks (whole so each can be CRC-checked).
type ReadOp struct {
	Object string
	Offset int64
	Length int64
	Chunks []ChunkRead
}

// LoadPlan is the result of PlanLoad.
type LoadPlan struct {
	Ops []ReadOp
	// BytesNeeded is the sum of the requested bytes; BytesRead the sum of
	// the ops' lengths (read amplification = BytesRead / BytesNeeded).
	BytesNeeded int64
	BytesRead   int64
}

// LoadOptions tune PlanLoad.
type LoadOptions struct {
	// MaxReadBytes caps a coalesced read (a single larger chunk is still
	// read whole). 0 means 64 MiB.
	MaxReadBytes int64
	// MaxGapBytes is the largest hole between two needed chunks that is
	// read through rather than split (0: only adjacent chunks coalesce).
	MaxGapBytes int64
}

// Package native converts a checkpoint of any format the loader reads (for
// example PyTorch DCP) into ckptkit's native format, saved by the saver as
// one rank. The saver takes an in-memory state dict, so the whole
// checkpoint is held in memory; Options.MaxMemory refuses checkpoints
// larger than the cap instead of exhausting memory.
package native

import (
	"context"
	"fmt"
	"strings"

	"github.com/ckptkit/ckptkit/ckpterr"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// ErrCheckpointTooLarge: the checkpoint does not fit the memory cap.
var ErrCheckpointTooLarge = ckpterr.New(ckpterr.Usage, "checkpoint does not fit the memory cap")

// Options tune Convert.
type Options struct {
	// ModelOnly keeps only the model's keys ("<model prefix>.*"); the
	// result records the optimizer as deliberately omitted.
	ModelOnly bool
	// MaxMemory caps the bytes held (0: no cap).
	MaxMemory int64
	// Overwrite replaces a committed checkpoint at the destination.
	Overwrite bool
}

// Convert reads every key of src and saves it at dst with the same key
// names, iteration and prefixes.
func Convert(ctx context.Context, src *loader.Checkpoint, dst *backend.Store, opts Options) (*saver.Result, error) {
	md := src.Metadata()
	tr := md.Training
	modelPrefix := tr.ModelPrefix
	if modelPrefix == "" {
		modelPrefix = saver.DefaultModelPrefix
	}
	keep := func(k string) bool { return !opts.ModelOnly || strings.HasPrefix(k, modelPrefix+".") }
	var total int64
	for i := range md.Tensors {
		if keep(md.Tensors[i].Key) {
			total += statedict.NumElements(md.Tensors[i].Shape) * metadata.ElementSize(md.Tensors[i].DType)
		}
	}
	for _, b := range md.Bytes {
		if keep(b.Key) {
			total += b.Length
		}
	}
	if opts.MaxMemory > 0 && total > opts.MaxMemory {
		return nil, fmt.Errorf("convert %s: %w: %d bytes of state, cap %d (native output is saved from memory)", src.URL(), ErrCheckpointTooLarge, total, opts.MaxMemory)
	}
	sd := statedict.New()
	for i := range md.Tensors {
		k := md.Tensors[i].Key
		if !keep(k) {
			continue
		}
		t, err := src.ReadTensor(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
		}
		sd.Tensors[k] = statedict.Whole(t)
	}
	for _, b := range md.Bytes {
		if !keep(b.Key) {
			continue
		}
		v, err := src.ReadBytes(ctx, b.Key)
		if err != nil {
			return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
		}
		sd.Bytes[b.Key] = v
	}
	so := saver.Options{
		Iteration:       tr.Iteration,
		ModelPrefix:     tr.ModelPrefix,
		OptimizerPrefix: tr.OptimizerPrefix,
		SchedulerPrefix: tr.SchedulerPrefix,
		OptimizerSlots:  tr.OptimizerSlots,
		NoSaveOptimizer: opts.ModelOnly || tr.Optimizer == metadata.OptimizerOmitted,
		Overwrite:       opts.Overwrite,
	}
	res, err := saver.SaveLocal(ctx, dst, []*statedict.StateDict{sd}, so)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", src.URL(), err)
	}
	return res, nil
}

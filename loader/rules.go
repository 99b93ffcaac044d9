package loader

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// maxListed caps how many keys an error or log line names.
const maxListed = 5

// keyRef is one key of one rank's target.
type keyRef struct {
	rank int
	key  string
}

// decision is the outcome of the resume rules for a set of targets: which
// target keys to read, which to leave untouched and why.
type decision struct {
	read        []keyRef
	lazyParams  []string // parameters whose optimizer state is wholly absent
	lazyKeys    []string // their target keys, left untouched
	skippedOpt  []string // optimizer keys not loaded (NoLoadOptimizer or not saved)
	frozen      []string // missing frozen model keys, left untouched
	extra       []string // checkpoint keys no target asked for
	optimLoaded bool
}

func listSome(keys []string) string {
	if len(keys) <= maxListed {
		return strings.Join(keys, ", ")
	}
	return fmt.Sprintf("%s, ... (%d in all)", strings.Join(keys[:maxListed], ", "), len(keys))
}

// decide applies the resume rules (docs/RESUME.md) to the targets without
// touching them or any storage.
func decide(md *metadata.Checkpoint, targets []*statedict.StateDict, opts *Options) (*decision, error) {
	d := &decision{}
	optPrefix := opts.OptimizerPrefix + "."
	statePrefix := statedict.StatePrefix(opts.OptimizerPrefix)
	has := func(k string) bool { return md.Tensor(k) != nil || md.BytesValue(k) != nil }

	// Every distinct target key, with the ranks that want it.
	ranksOf := map[string][]int{}
	for r, sd := range targets {
		for k := range sd.Tensors {
			ranksOf[k] = append(ranksOf[k], r)
		}
		for k := range sd.Bytes {
			ranksOf[k] = append(ranksOf[k], r)
		}
	}
	keys := make([]string, 0, len(ranksOf))
	for k := range ranksOf {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	skip := map[string]bool{}
	// Rule 6: the optimizer is not loaded when the caller says so or when
	// the checkpoint deliberately omitted it; everything else still loads.
	// A checkpoint whose record says it never had optimizer keys ("none")
	// does not silently reset a target that asks for them: that is either
	// another key prefix or a weights-only checkpoint, and the caller must
	// say NoLoadOptimizer to start fresh.
	if md.Training.Optimizer == metadata.OptimizerNone && !opts.NoLoadOptimizer {
		var asked []string
		for _, k := range keys {
			if strings.HasPrefix(k, optPrefix) {
				asked = append(asked, k)
			}
		}
		if len(asked) > 0 {
			return nil, fmt.Errorf("%w: the checkpoint has no optimizer keys under %q (record: %s) but the target asks for %d, e.g. %s; if the checkpoint holds only weights, load without the optimizer to start it fresh (Go: Options.NoLoadOptimizer; ckpt: --no-load-optim; ckptkit.torch.resume: load_optimizer=False), otherwise check the optimizer key prefix",
				ErrMissingKeys, optPrefix, md.Training.Optimizer, len(asked), listSome(asked))
		}
	}
	optimSaved := md.Training.Optimizer == metadata.OptimizerSaved
	d.optimLoaded = !opts.NoLoadOptimizer && optimSaved
	if !d.optimLoaded {
		for _, k := range keys {
			if strings.HasPrefix(k, optPrefix) {
				skip[k] = true
				d.skippedOpt = append(d.skippedOpt, k)
			}
		}
	} else {
		// Rules 1-3: lazily absent, partial, layout mismatch, judged per
		// parameter: a target parameter's expected slots are those its
		// target (the resuming optimizer's fresh state) holds, whatever
		// the optimizer (docs/RESUME.md, Per-parameter rules).
		var targetFqns []string
		model := statedict.ModelKey(opts.ModelPrefix, "")
		for _, k := range keys {
			if fqn, ok := strings.CutPrefix(k, model); ok {
				targetFqns = append(targetFqns, fqn)
			}
		}
		for _, g := range opts.ParamGroups {
			targetFqns = append(targetFqns, g...)
		}
		sk := stateKeys(md, opts.OptimizerPrefix, opts.ModelPrefix, targetFqns...)
		type paramSlots struct{ want, have []string }
		params := map[string]*paramSlots{}
		for _, k := range keys {
			fqn, _, ok := sk.Split(k)
			if !ok {
				continue
			}
			p := params[fqn]
			if p == nil {
				p = &paramSlots{}
				params[fqn] = p
			}
			p.want = append(p.want, k)
			if has(k) {
				p.have = append(p.have, k)
			}
		}
		ckptParams := savedSlots(md, sk)
		fqns := make([]string, 0, len(params))
		for f := range params {
			fqns = append(fqns, f)
		}
		sort.Strings(fqns)
		partialBy := map[string][]string{} // fqn -> missing keys
		for _, fqn := range fqns {
			p := params[fqn]
			switch {
			case len(p.have) == 0 && len(ckptParams[fqn]) == 0:
				d.lazyParams = append(d.lazyParams, fqn)
				for _, k := range p.want {
					skip[k] = true
					d.lazyKeys = append(d.lazyKeys, k)
				}
			case len(p.have) < len(p.want):
				for _, k := range p.want {
					if !has(k) {
						partialBy[fqn] = append(partialBy[fqn], k)
					}
				}
			}
		}
		// The checkpoint side: corruption anywhere is refused, whether or
		// not this target asks for the parameter (a target built from the
		// metadata asks only for what is there): by the slot census where
		// the writer recorded one, else by the subset rule.
		{
			missing, _ := partialSaved(md, ckptParams)
			for fqn, slots := range missing {
				for _, slot := range slots {
					k := statedict.StateKey(opts.OptimizerPrefix, fqn, slot)
					if !slices.Contains(partialBy[fqn], k) {
						partialBy[fqn] = append(partialBy[fqn], k)
					}
				}
			}
		}
		var partial []string
		for _, fqn := range sortedKeys(partialBy) {
			var have []string
			for _, slot := range ckptParams[fqn] {
				have = append(have, statedict.StateKey(opts.OptimizerPrefix, fqn, slot))
			}
			missing := partialBy[fqn]
			sort.Strings(missing)
			partial = append(partial, fmt.Sprintf("parameter %q has %s but lacks %s", fqn, orNone(have), strings.Join(missing, ", ")))
		}
		if len(partial) > 0 {
			return nil, fmt.Errorf("%w (corrupt or incomplete save; refusing to resume with zeroed state): %s", ErrPartialOptimizerState, strings.Join(partial, "; "))
		}
		// The param-group rule, the half the metadata decides: as many
		// groups as the target's optimizer (their members are compared
		// with the values, read before any target byte is written).
		if opts.ParamGroups != nil {
			if err := checkGroupCount(md, opts); err != nil {
				return nil, err
			}
		}
		// Rule 3: every target parameter lazily absent while state was saved.
		// When the checkpoint records its parameter set, the layout matches
		// if some target parameter is one of the checkpoint's parameters
		// (a rank holding only unrouted experts: lazy, not a mismatch).
		// Older checkpoints without the record fall back to: saved state
		// that belongs to the checkpoint's own model keys means the layout
		// matches.
		if n := savedStateEntries(md, opts); len(params) > 0 && len(d.lazyParams) == len(params) && n > 0 &&
			!layoutMatches(md, ckptParams, fqns, opts.ModelPrefix) {
			return nil, layoutError(md, n, statePrefix, fqns, params[fqns[0]].want)
		}
	}

	// Rule 5: strict model and other keys, kinds, dtypes and shapes.
	frozen := map[string]bool{}
	for _, k := range opts.Frozen {
		frozen[k] = true
	}
	var missing, mismatch []string
	for _, k := range keys {
		if skip[k] {
			continue
		}
		if !has(k) {
			if frozen[k] {
				d.frozen = append(d.frozen, k)
				continue
			}
			missing = append(missing, k)
			continue
		}
		for _, r := range ranksOf[k] {
			if msg := compare(md, targets[r], k, r); msg != "" {
				mismatch = append(mismatch, msg)
			}
			d.read = append(d.read, keyRef{rank: r, key: k})
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrMissingKeys, listSome(missing))
	}
	if len(mismatch) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrTargetMismatch, strings.Join(mismatch[:min(len(mismatch), maxListed)], "; "))
	}
	forEachKey(md, func(k string) {
		if _, wanted := ranksOf[k]; !wanted && !(!d.optimLoaded && strings.HasPrefix(k, optPrefix)) {
			d.extra = append(d.extra, k)
		}
	})
	return d, nil
}

// savedStateEntries counts what the checkpoint says it saved as
// per-parameter optimizer state.
func savedStateEntries(md *metadata.Checkpoint, opts *Options) int {
	n := md.Training.OptimizerStateEntries
	if n == 0 {
		forEachKey(md, func(k string) {
			if strings.HasPrefix(k, statedict.StatePrefix(opts.OptimizerPrefix)) {
				n++
			}
		})
	}
	return n
}

// layoutMatches reports whether the target's parameters (targetFqns, all
// without saved state) belong to the checkpoint's optimizer layout: one of
// them is in the checkpoint's recorded parameter set, or, for checkpoints
// that do not record it, some parameter with saved state is a model key of
// the checkpoint.
func layoutMatches(md *metadata.Checkpoint, ckptParams map[string][]string, targetFqns []string, modelPrefix string) bool {
	if recorded := md.Training.Params; len(recorded) > 0 {
		for _, fqn := range targetFqns {
			if slices.Contains(recorded, fqn) {
				return true
			}
		}
		return false
	}
	for fqn := range ckptParams {
		if md.Tensor(statedict.ModelKey(modelPrefix, fqn)) != nil {
			return true
		}
	}
	return false
}

func layoutError(md *metadata.Checkpoint, entries int, statePrefix string, fqns, wantOne []string) error {
	var saved []string
	ckptState := statedict.StatePrefix(md.Training.OptimizerPrefix)
	forEachKey(md, func(k string) {
		if len(saved) < 3 && md.Training.OptimizerPrefix != "" && strings.HasPrefix(k, ckptState) {
			saved = append(saved, k)
		}
	})
	expected := slices.Clone(wantOne)
	if len(expected) > 3 {
		expected = expected[:3]
	}
	return fmt.Errorf("%w: the checkpoint holds %d optimizer state entries (e.g. %s) but none belongs to any of the %d trainable parameters of the target (expected e.g. %s under %q); refusing to silently restart the optimizer",
		ErrLayoutMismatch, entries, strings.Join(saved, ", "), len(fqns), strings.Join(expected, ", "), statePrefix)
}

// compare checks kind, dtype and shape of one target key against the
// checkpoint; it returns a message naming both sides, or "".
func compare(md *metadata.Checkpoint, sd *statedict.StateDict, key string, rank int) string {
	te := md.Tensor(key)
	sh, isTensor := sd.Tensors[key]
	switch {
	case isTensor && te == nil:
		return fmt.Sprintf("%q: checkpoint holds bytes, rank %d target wants a tensor", key, rank)
	case !isTensor && te != nil:
		return fmt.Sprintf("%q: checkpoint holds a tensor %s%v, rank %d target wants bytes", key, te.DType, te.Shape, rank)
	case !isTensor:
		return ""
	}
	if string(sh.DType) != te.DType || !slices.Equal(sh.GlobalShape, te.Shape) {
		return fmt.Sprintf("%q: checkpoint %s%v, rank %d target %s%v", key, te.DType, te.Shape, rank, sh.DType, sh.GlobalShape)
	}
	if err := sh.Check(); err != nil {
		return fmt.Sprintf("%q: rank %d target: %v", key, rank, err)
	}
	return ""
}

func orNone(keys []string) string {
	if len(keys) == 0 {
		return "no saved slot"
	}
	return strings.Join(keys, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func forEachKey(md *metadata.Checkpoint, fn func(string)) {
	for i := range md.Tensors {
		fn(md.Tensors[i].Key)
	}
	for i := range md.Bytes {
		fn(md.Bytes[i].Key)
	}
}

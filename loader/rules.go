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
// touching them or any storage: a function per rule, in this order.
func decide(md *metadata.Checkpoint, targets []*statedict.StateDict, opts *Options) (*decision, error) {
	r := newRuling(md, targets, opts)
	if err := r.optimizerRecorded(); err != nil {
		return nil, err
	}
	if r.d.optimLoaded {
		if err := r.perParameter(); err != nil {
			return nil, err
		}
	} else {
		r.skipOptimizer()
	}
	if err := r.strictKeys(); err != nil {
		return nil, err
	}
	r.extraKeys()
	return r.d, nil
}

// ruling is one decide call: the checkpoint, the targets, and what the
// rules decided so far.
type ruling struct {
	md        *metadata.Checkpoint
	targets   []*statedict.StateDict
	opts      *Options
	optPrefix string
	d         *decision
	keys      []string         // every distinct target key, sorted
	ranksOf   map[string][]int // the ranks that want each key
	skip      map[string]bool  // target keys left untouched
}

func newRuling(md *metadata.Checkpoint, targets []*statedict.StateDict, opts *Options) *ruling {
	r := &ruling{md: md, targets: targets, opts: opts, optPrefix: opts.OptimizerPrefix + ".", d: &decision{},
		ranksOf: map[string][]int{}, skip: map[string]bool{}}
	for rank, sd := range targets {
		for k := range sd.Tensors {
			r.ranksOf[k] = append(r.ranksOf[k], rank)
		}
		for k := range sd.Bytes {
			r.ranksOf[k] = append(r.ranksOf[k], rank)
		}
	}
	r.keys = make([]string, 0, len(r.ranksOf))
	for k := range r.ranksOf {
		r.keys = append(r.keys, k)
	}
	sort.Strings(r.keys)
	r.d.optimLoaded = !opts.NoLoadOptimizer && md.Training.Optimizer == metadata.OptimizerSaved
	return r
}

// has reports whether the checkpoint holds key k.
func (r *ruling) has(k string) bool { return r.md.Tensor(k) != nil || r.md.BytesValue(k) != nil }

// optimizerRecorded is rule 6's guard: a checkpoint whose record says it
// never had optimizer keys ("none") does not silently reset a target that
// asks for them: that is either another key prefix or a weights-only
// checkpoint, and the caller must say NoLoadOptimizer to start fresh.
func (r *ruling) optimizerRecorded() error {
	if r.md.Training.Optimizer != metadata.OptimizerNone || r.opts.NoLoadOptimizer {
		return nil
	}
	var asked []string
	for _, k := range r.keys {
		if strings.HasPrefix(k, r.optPrefix) {
			asked = append(asked, k)
		}
	}
	if len(asked) > 0 {
		return fmt.Errorf("%w: the checkpoint has no optimizer keys under %q (record: %s) but the target asks for %d, e.g. %s; if the checkpoint holds only weights, load without the optimizer to start it fresh (Go: Options.NoLoadOptimizer; ckpt: --no-load-optim; ckptkit.torch.resume: load_optimizer=False), otherwise check the optimizer key prefix",
			ErrMissingKeys, r.optPrefix, r.md.Training.Optimizer, len(asked), listSome(asked))
	}
	return nil
}

// skipOptimizer is rule 6: the optimizer is not loaded when the caller
// says so or when the checkpoint deliberately omitted it; everything else
// still loads.
func (r *ruling) skipOptimizer() {
	for _, k := range r.keys {
		if strings.HasPrefix(k, r.optPrefix) {
			r.skip[k] = true
			r.d.skippedOpt = append(r.d.skippedOpt, k)
		}
	}
}

// paramSlots are one target parameter's optimizer keys: those its target
// holds (want) and those of them the checkpoint has.
type paramSlots struct{ want, have []string }

// perParameter is rules 1-3, judged per parameter: a target parameter's
// expected slots are those its target (the resuming optimizer's fresh
// state) holds, whatever the optimizer (docs/RESUME.md, Per-parameter
// rules): lazily absent, partial, the param groups, layout mismatch.
func (r *ruling) perParameter() error {
	sk := stateKeys(r.md, r.opts.OptimizerPrefix, r.opts.ModelPrefix, r.targetParams()...)
	params := map[string]*paramSlots{}
	for _, k := range r.keys {
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
		if r.has(k) {
			p.have = append(p.have, k)
		}
	}
	ckptParams := savedSlots(r.md, sk)
	fqns := sortedKeys(params)
	partialBy := r.lazyOrPartial(fqns, params, ckptParams)
	r.partialSaved(ckptParams, partialBy)
	if err := r.refusePartial(ckptParams, partialBy); err != nil {
		return err
	}
	// The param-group rule, the half the metadata decides: as many groups
	// as the target's optimizer (their members are compared with the
	// values, read before any target byte is written).
	if r.opts.ParamGroups != nil {
		if err := checkGroupCount(r.md, r.opts); err != nil {
			return err
		}
	}
	return r.layout(fqns, params, ckptParams)
}

// targetParams returns the target's parameter names: its model keys and
// the members of its param groups.
func (r *ruling) targetParams() []string {
	var fqns []string
	model := statedict.ModelKey(r.opts.ModelPrefix, "")
	for _, k := range r.keys {
		if fqn, ok := strings.CutPrefix(k, model); ok {
			fqns = append(fqns, fqn)
		}
	}
	for _, g := range r.opts.ParamGroups {
		fqns = append(fqns, g...)
	}
	return fqns
}

// lazyOrPartial is rules 1 and 2 on the target side: a parameter with none
// of its slots (and none saved) is lazily absent, its keys left untouched;
// one with some is partial. It returns the partial ones' missing keys.
func (r *ruling) lazyOrPartial(fqns []string, params map[string]*paramSlots, ckptParams map[string][]string) map[string][]string {
	partialBy := map[string][]string{} // fqn -> missing keys
	for _, fqn := range fqns {
		p := params[fqn]
		switch {
		case len(p.have) == 0 && len(ckptParams[fqn]) == 0:
			r.d.lazyParams = append(r.d.lazyParams, fqn)
			for _, k := range p.want {
				r.skip[k] = true
				r.d.lazyKeys = append(r.d.lazyKeys, k)
			}
		case len(p.have) < len(p.want):
			for _, k := range p.want {
				if !r.has(k) {
					partialBy[fqn] = append(partialBy[fqn], k)
				}
			}
		}
	}
	return partialBy
}

// partialSaved is rule 2 on the checkpoint side: corruption anywhere is
// refused, whether or not this target asks for the parameter (a target
// built from the metadata asks only for what is there): by the slot
// census where the writer recorded one, else by the subset rule. It adds
// the missing keys to partialBy.
func (r *ruling) partialSaved(ckptParams map[string][]string, partialBy map[string][]string) {
	missing, _ := partialSaved(r.md, ckptParams)
	for fqn, slots := range missing {
		for _, slot := range slots {
			k := statedict.StateKey(r.opts.OptimizerPrefix, fqn, slot)
			if !slices.Contains(partialBy[fqn], k) {
				partialBy[fqn] = append(partialBy[fqn], k)
			}
		}
	}
}

// refusePartial fails naming every partial parameter, what it has and what
// it lacks.
func (r *ruling) refusePartial(ckptParams map[string][]string, partialBy map[string][]string) error {
	var partial []string
	for _, fqn := range sortedKeys(partialBy) {
		var have []string
		for _, slot := range ckptParams[fqn] {
			have = append(have, statedict.StateKey(r.opts.OptimizerPrefix, fqn, slot))
		}
		missing := partialBy[fqn]
		sort.Strings(missing)
		partial = append(partial, fmt.Sprintf("parameter %q has %s but lacks %s", fqn, orNone(have), strings.Join(missing, ", ")))
	}
	if len(partial) > 0 {
		return fmt.Errorf("%w (corrupt or incomplete save; refusing to resume with zeroed state): %s", ErrPartialOptimizerState, strings.Join(partial, "; "))
	}
	return nil
}

// layout is rule 3: every target parameter lazily absent while state was
// saved. When the checkpoint records its parameter set, the layout matches
// if some target parameter is one of the checkpoint's parameters (a rank
// holding only unrouted experts: lazy, not a mismatch). Older checkpoints
// without the record fall back to: saved state that belongs to the
// checkpoint's own model keys means the layout matches.
func (r *ruling) layout(fqns []string, params map[string]*paramSlots, ckptParams map[string][]string) error {
	if n := savedStateEntries(r.md, r.opts); len(params) > 0 && len(r.d.lazyParams) == len(params) && n > 0 &&
		!layoutMatches(r.md, ckptParams, fqns, r.opts.ModelPrefix) {
		return layoutError(r.md, n, statedict.StatePrefix(r.opts.OptimizerPrefix), fqns, params[fqns[0]].want)
	}
	return nil
}

// strictKeys is rule 5: every other target key must be in the checkpoint
// (missing frozen model keys are left untouched), with its kind, dtype and
// shape; it records the keys to read.
func (r *ruling) strictKeys() error {
	frozen := map[string]bool{}
	for _, k := range r.opts.Frozen {
		frozen[k] = true
	}
	var missing, mismatch []string
	for _, k := range r.keys {
		if r.skip[k] {
			continue
		}
		if !r.has(k) {
			if frozen[k] {
				r.d.frozen = append(r.d.frozen, k)
				continue
			}
			missing = append(missing, k)
			continue
		}
		for _, rank := range r.ranksOf[k] {
			if msg := compare(r.md, r.targets[rank], k, rank); msg != "" {
				mismatch = append(mismatch, msg)
			}
			r.d.read = append(r.d.read, keyRef{rank: rank, key: k})
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrMissingKeys, listSome(missing))
	}
	if len(mismatch) > 0 {
		return fmt.Errorf("%w: %s", ErrTargetMismatch, strings.Join(mismatch[:min(len(mismatch), maxListed)], "; "))
	}
	return nil
}

// extraKeys records the checkpoint keys no target asked for (the optimizer
// keys of a load without the optimizer excepted).
func (r *ruling) extraKeys() {
	forEachKey(r.md, func(k string) {
		if _, wanted := r.ranksOf[k]; !wanted && !(!r.d.optimLoaded && strings.HasPrefix(k, r.optPrefix)) {
			r.d.extra = append(r.d.extra, k)
		}
	})
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

package loader

import (
	"slices"
	"sort"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// stateKeys returns the splitter of per-parameter optimizer state keys
// under optimizerPrefix that knows the checkpoint's parameter names (its
// recorded parameter set and its model keys under modelPrefix) and more,
// those of a load target.
func stateKeys(md *metadata.Checkpoint, optimizerPrefix, modelPrefix string, more ...string) *statedict.StateKeys {
	sk := statedict.NewStateKeys(optimizerPrefix, md.Training.Params...)
	model := statedict.ModelKey(modelPrefix, "")
	for i := range md.Tensors {
		if fqn, ok := strings.CutPrefix(md.Tensors[i].Key, model); ok {
			sk.Add(fqn)
		}
	}
	sk.Add(more...)
	return sk
}

// savedSlots returns, per parameter, the optimizer slots the checkpoint
// holds for it, sorted.
func savedSlots(md *metadata.Checkpoint, sk *statedict.StateKeys) map[string][]string {
	per := map[string][]string{}
	forEachKey(md, func(k string) {
		if fqn, slot, ok := sk.Split(k); ok {
			per[fqn] = append(per[fqn], slot)
		}
	})
	for _, slots := range per {
		sort.Strings(slots)
	}
	return per
}

// partialSaved applies the checkpoint-side rule of partial state (rule 2)
// to the saved slots of each parameter, without the optimizer: with a slot
// census (training.slot_sets) each recorded parameter must hold exactly
// the slots of its set; without one, a parameter's saved slots are partial
// when they are a strict subset of another parameter's in the same param
// group (the subset rule: {step, variance} next to {col_var, row_var,
// step} is whole, {row_var, step} is not). It returns, per partial
// parameter, the slots it lacks, sorted, and whether the census decided.
func partialSaved(md *metadata.Checkpoint, saved map[string][]string) (map[string][]string, bool) {
	out := map[string][]string{}
	if census := md.Training.Census(); census != nil {
		for fqn, want := range census {
			var missing []string
			for _, s := range want {
				if !slices.Contains(saved[fqn], s) {
					missing = append(missing, s)
				}
			}
			if len(missing) > 0 {
				out[fqn] = missing
			}
		}
		return out, true
	}
	// The param groups the checkpoint lists, and one more for the
	// parameters with state that none of them holds.
	groups := slices.Clone(md.Training.ParamGroups)
	grouped := map[string]bool{}
	for _, g := range groups {
		for _, fqn := range g {
			grouped[fqn] = true
		}
	}
	var rest []string
	for _, fqn := range sortedKeys(saved) {
		if !grouped[fqn] {
			rest = append(rest, fqn)
		}
	}
	groups = append(groups, rest)
	for _, g := range groups {
		// The distinct non-empty slot sets of the group: few, so every
		// pair is compared.
		var sets [][]string
		id := map[string]int{}
		member := map[string]int{}
		for _, fqn := range g {
			slots := saved[fqn]
			if len(slots) == 0 {
				continue
			}
			k := strings.Join(slots, "\x00")
			i, ok := id[k]
			if !ok {
				i = len(sets)
				id[k] = i
				sets = append(sets, slots)
			}
			member[fqn] = i
		}
		missing := make([][]string, len(sets))
		for a, sa := range sets {
			for b, sb := range sets {
				if a == b || !strictSubset(sa, sb) {
					continue
				}
				// Only the smallest supersets: {step} inside {exp_avg,
				// step} inside {exp_avg, exp_avg_sq, step} lacks exp_avg
				// first.
				minimal := true
				for c, sc := range sets {
					if c != a && c != b && strictSubset(sa, sc) && strictSubset(sc, sb) {
						minimal = false
						break
					}
				}
				if !minimal {
					continue
				}
				for _, s := range sb {
					if !slices.Contains(sa, s) && !slices.Contains(missing[a], s) {
						missing[a] = append(missing[a], s)
					}
				}
			}
			sort.Strings(missing[a])
		}
		for fqn, i := range member {
			if len(missing[i]) > 0 {
				out[fqn] = missing[i]
			}
		}
	}
	return out, false
}

// strictSubset reports whether sorted a is a strict subset of sorted b.
func strictSubset(a, b []string) bool {
	if len(a) >= len(b) {
		return false
	}
	for _, s := range a {
		if _, found := slices.BinarySearch(b, s); !found {
			return false
		}
	}
	return true
}

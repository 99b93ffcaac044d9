package loader

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// savedGroupKeys returns the checkpoint's "<prefix>.param_groups.<i>.params"
// bytes keys by group index, and an error when the indices are not
// 0..n-1.
func savedGroupKeys(md *metadata.Checkpoint, optimizerPrefix string) ([]string, error) {
	byIndex := map[int]string{}
	for i := range md.Bytes {
		k := md.Bytes[i].Key
		n, ok := statedict.ParamsKeyGroup(k, optimizerPrefix)
		if !ok {
			continue
		}
		// "param_groups.00.params" would name group 0 a second way.
		if n < 0 || n >= len(md.Bytes) || statedict.ParamGroupKey(optimizerPrefix, n, statedict.ParamsField) != k {
			return nil, fmt.Errorf("%w: param-group key %q has no usable group index", ErrLayoutMismatch, k)
		}
		if prev, dup := byIndex[n]; dup {
			return nil, fmt.Errorf("%w: param-group keys %q and %q name the same group", ErrLayoutMismatch, prev, k)
		}
		byIndex[n] = k
	}
	keys := make([]string, len(byIndex))
	for n, k := range byIndex {
		if n >= len(keys) {
			return nil, fmt.Errorf("%w: the checkpoint's param groups are not numbered 0..%d (it has %q)", ErrLayoutMismatch, len(keys)-1, k)
		}
		keys[n] = k
	}
	return keys, nil
}

// checkGroupCount is the metadata half of the param-group rule: the
// checkpoint has as many param groups as opts.ParamGroups.
func checkGroupCount(md *metadata.Checkpoint, opts *Options) error {
	keys, err := savedGroupKeys(md, opts.OptimizerPrefix)
	if err != nil {
		return err
	}
	if len(keys) != len(opts.ParamGroups) {
		sizes := make([]string, len(opts.ParamGroups))
		for i, g := range opts.ParamGroups {
			sizes[i] = strconv.Itoa(len(g))
		}
		return fmt.Errorf("%w: the checkpoint has %d optimizer param group(s) (%q, ...), the target's optimizer has %d (of %s parameters); build the optimizer with the param groups it was saved with",
			ErrLayoutMismatch, len(keys), statedict.ParamGroupKey(opts.OptimizerPrefix, 0, statedict.ParamsField), len(opts.ParamGroups), strings.Join(sizes, ", "))
	}
	return nil
}

// checkParamGroups is the data half of the param-group rule: it reads the
// checkpoint's "<prefix>.param_groups.<i>.params" values (small bytes
// values, CRC-checked, through the checkpoint's store; nothing is written
// to any target) and compares each with opts.ParamGroups[i] as sets of
// fqns. It returns the bytes and requests it read.
func (c *Checkpoint) checkParamGroups(ctx context.Context, opts *Options) (int64, int, error) {
	keys, err := savedGroupKeys(c.md, opts.OptimizerPrefix)
	if err != nil {
		return 0, 0, err
	}
	reqs := make([]planner.ReadRequest, len(keys))
	for i, k := range keys {
		reqs[i] = planner.ReadRequest{Key: k, Kind: planner.BytesItem}
	}
	plan, err := planner.PlanLoad(c.md, reqs, planner.LoadOptions{MaxReadBytes: opts.MaxReadBytes})
	if err != nil {
		return 0, 0, err
	}
	chunks, err := c.readAll(ctx, plan, opts.Concurrency)
	if err != nil {
		return plan.BytesRead, len(plan.Ops), err
	}
	saved := map[string][]string{}
	for i := range plan.Ops {
		for j := range plan.Ops[i].Chunks {
			key := plan.Ops[i].Chunks[j].Key
			var fqns []string
			if err := json.Unmarshal(chunks[i][j], &fqns); err != nil {
				return plan.BytesRead, len(plan.Ops), fmt.Errorf("%w: %q is not a list of parameter names (%v), so the checkpoint's param groups cannot be compared with the target's", ErrLayoutMismatch, key, err)
			}
			saved[key] = fqns
		}
	}
	groupOf := func(groups [][]string) map[string]int {
		m := map[string]int{}
		for i, g := range groups {
			for _, f := range g {
				m[f] = i
			}
		}
		return m
	}
	ckptGroups := make([][]string, len(keys))
	for i, k := range keys {
		ckptGroups[i] = saved[k]
	}
	inCkpt, inTarget := groupOf(ckptGroups), groupOf(opts.ParamGroups)
	where := func(m map[string]int, fqn string) string {
		if g, ok := m[fqn]; ok {
			return "group " + strconv.Itoa(g)
		}
		return "no group"
	}
	var diffs []string
	for i := range keys {
		onlyCkpt := setMinus(ckptGroups[i], opts.ParamGroups[i])
		onlyTarget := setMinus(opts.ParamGroups[i], ckptGroups[i])
		if len(onlyCkpt) == 0 && len(onlyTarget) == 0 {
			continue
		}
		var parts []string
		for _, f := range onlyCkpt[:min(len(onlyCkpt), maxListed)] {
			parts = append(parts, fmt.Sprintf("%s is in the checkpoint's group but in the target's %s", f, where(inTarget, f)))
		}
		for _, f := range onlyTarget[:min(len(onlyTarget), maxListed)] {
			parts = append(parts, fmt.Sprintf("%s is in the target's group but in the checkpoint's %s", f, where(inCkpt, f)))
		}
		if n := len(onlyCkpt) + len(onlyTarget); n > len(parts) {
			parts = append(parts, fmt.Sprintf("... (%d in all)", n))
		}
		diffs = append(diffs, fmt.Sprintf("param group %d (%d parameters in the checkpoint, %d in the target): %s", i, len(ckptGroups[i]), len(opts.ParamGroups[i]), strings.Join(parts, ", ")))
	}
	if len(diffs) > 0 {
		return plan.BytesRead, len(plan.Ops), fmt.Errorf("%w: the optimizer's param groups differ from the checkpoint's: %s; build the optimizer with the param groups it was saved with",
			ErrLayoutMismatch, strings.Join(diffs[:min(len(diffs), maxListed)], "; "))
	}
	return plan.BytesRead, len(plan.Ops), nil
}

// setMinus returns the distinct members of a not in b, sorted.
func setMinus(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, f := range b {
		in[f] = true
	}
	var out []string
	for _, f := range a {
		if !in[f] {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

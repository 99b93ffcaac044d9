package statedict

import (
	"strconv"
	"strings"
)

// The key schema of a flattened training state, in one place:
//
//	<model>.<fqn>                                  parameters and buffers
//	<optimizer>.state.<fqn>.<slot>                 per-parameter optimizer state (AdamW: step, exp_avg, exp_avg_sq)
//	<optimizer>.param_groups.<i>.<field>           hyper-parameters of param group i (lr, betas, ...)
//	<optimizer>.param_groups.<i>.params            the fqns of the parameters of group i
//	<scheduler>.<field>                            LR scheduler state
//
// <model>, <optimizer> and <scheduler> are prefixes chosen by the caller of
// the saver and loader (defaults below); the other words are fixed by the
// flattening PyTorch's distributed checkpoint uses (torch >= 2.4).
const (
	// DefaultModelPrefix is the default key prefix of model entries.
	DefaultModelPrefix = "model"
	// DefaultOptimizerPrefix is the default key prefix of optimizer entries.
	DefaultOptimizerPrefix = "optimizer"
	// DefaultSchedulerPrefix is the default key prefix of scheduler entries.
	DefaultSchedulerPrefix = "scheduler"

	// StateWord follows the optimizer prefix in per-parameter state keys.
	StateWord = "state"
	// ParamGroupsWord follows the optimizer prefix in param-group keys.
	ParamGroupsWord = "param_groups"
	// ParamsField is the param-group field listing the group's parameters.
	ParamsField = "params"

	// SlotStep, SlotExpAvg and SlotExpAvgSq are AdamW's per-parameter slots.
	SlotStep     = "step"
	SlotExpAvg   = "exp_avg"
	SlotExpAvgSq = "exp_avg_sq"
)

// AdamWSlots returns AdamW's per-parameter slot names (a fresh slice).
func AdamWSlots() []string { return []string{SlotStep, SlotExpAvg, SlotExpAvgSq} }

// ModelKey returns "<modelPrefix>.<fqn>".
func ModelKey(modelPrefix, fqn string) string { return modelPrefix + "." + fqn }

// StatePrefix returns "<optimizerPrefix>.state.", the prefix of every
// per-parameter optimizer state key.
func StatePrefix(optimizerPrefix string) string { return optimizerPrefix + "." + StateWord + "." }

// StateKey returns "<optimizerPrefix>.state.<fqn>.<slot>".
func StateKey(optimizerPrefix, fqn, slot string) string {
	return StatePrefix(optimizerPrefix) + fqn + "." + slot
}

// SplitStateKey parses "<optimizerPrefix>.state.<fqn>.<slot>" for one of
// slots (a key of another slot is not this optimizer's state).
func SplitStateKey(key, optimizerPrefix string, slots []string) (fqn, slot string, ok bool) {
	rest, found := strings.CutPrefix(key, StatePrefix(optimizerPrefix))
	if !found {
		return "", "", false
	}
	for _, s := range slots {
		if f, cut := strings.CutSuffix(rest, "."+s); cut && f != "" {
			return f, s, true
		}
	}
	return "", "", false
}

// ParamGroupKey returns "<optimizerPrefix>.param_groups.<group>.<field>".
func ParamGroupKey(optimizerPrefix string, group int, field string) string {
	return optimizerPrefix + "." + ParamGroupsWord + "." + strconv.Itoa(group) + "." + field
}

// IsParamsKey reports whether key is "<optimizerPrefix>.param_groups.<i>.params"
// for a decimal group index i: the key listing a group's parameters.
func IsParamsKey(key, optimizerPrefix string) bool {
	_, ok := ParamsKeyGroup(key, optimizerPrefix)
	return ok
}

// ParamsKeyGroup returns the group index i of a params key
// "<optimizerPrefix>.param_groups.<i>.params" (IsParamsKey), and whether
// key is one; i is -1 when the decimal index does not fit an int.
func ParamsKeyGroup(key, optimizerPrefix string) (int, bool) {
	rest, ok := strings.CutPrefix(key, optimizerPrefix+"."+ParamGroupsWord+".")
	if !ok {
		return 0, false
	}
	i, ok := strings.CutSuffix(rest, "."+ParamsField)
	if !ok || i == "" {
		return 0, false
	}
	for _, r := range i {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(i)
	if err != nil {
		return -1, true
	}
	return n, true
}

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

	// SlotStep, SlotExpAvg and SlotExpAvgSq are AdamW's per-parameter
	// slots (other optimizers have others: StateKeys needs none of them).
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

// StateKeys splits per-parameter optimizer state keys,
// "<optimizerPrefix>.state.<fqn>.<slot>", into parameter and slot for any
// optimizer: the fqn is the longest known parameter name the key continues
// with a dot (so a parameter "a.b" and a slot "exp_avg" are told apart
// from a parameter "a" and a slot "b.exp_avg"); a key of no known
// parameter splits at its last dot. The known names are those the caller
// adds (the checkpoint's recorded parameter set, its model keys, the load
// target's): slot names are never assumed, so an optimizer's slots are
// whatever its state holds (Adafactor's row_var, col_var and variance,
// SGD's momentum_buffer, a nested value's dotted path).
type StateKeys struct {
	prefix string
	fqns   map[string]struct{}
}

// NewStateKeys returns a splitter for the state keys under optimizerPrefix
// knowing fqns (more can be added with Add).
func NewStateKeys(optimizerPrefix string, fqns ...string) *StateKeys {
	s := &StateKeys{prefix: StatePrefix(optimizerPrefix), fqns: make(map[string]struct{}, len(fqns))}
	s.Add(fqns...)
	return s
}

// Add makes fqns known parameter names.
func (s *StateKeys) Add(fqns ...string) {
	for _, f := range fqns {
		if f != "" {
			s.fqns[f] = struct{}{}
		}
	}
}

// Split parses key as "<optimizerPrefix>.state.<fqn>.<slot>"; ok is false
// for a key outside the per-parameter state or without a slot.
func (s *StateKeys) Split(key string) (fqn, slot string, ok bool) {
	rest, found := strings.CutPrefix(key, s.prefix)
	if !found {
		return "", "", false
	}
	for i := len(rest) - 1; i > 0; i-- {
		if rest[i] != '.' {
			continue
		}
		if _, known := s.fqns[rest[:i]]; known && i < len(rest)-1 {
			return rest[:i], rest[i+1:], true
		}
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// SplitStateKey parses "<optimizerPrefix>.state.<fqn>.<slot>" for one of
// slots (a key of another slot is not this optimizer's state).
//
// Deprecated: slot names are not known in advance for every optimizer;
// use StateKeys, which splits by parameter names.
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

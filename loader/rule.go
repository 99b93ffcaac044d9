package loader

import (
	"errors"

	"github.com/ckptkit/ckptkit/planner"
)

// Rule names: the resume rules a verify report's findings name, and the
// rule an error breaks (RuleOf), which the C ABI carries to Python, whose
// exception types (python/ckptkit/errors.py) are keyed by these names.
const (
	RuleUncommitted      = "uncommitted"
	RuleMissingObject    = "missing-object"
	RuleObjectSize       = "object-size"
	RulePartialOptimizer = "partial-optimizer-state"
	RuleShardCoverage    = "shard-coverage"
	RuleLayoutMismatch   = "layout-mismatch"
	RuleChecksum         = "checksum"
	RuleLazyOptimizer    = "lazy-optimizer-state"
	RuleOptimizerOmitted = "optimizer-omitted"
	RuleMissingKeys      = "missing-keys"
	RuleMismatch         = "mismatch"
)

// ruleErrors is the one mapping between rules and the sentinels a load
// fails with, both ways: RuleError reads it by rule, RuleOf by error, in
// this order (the first sentinel an error wraps names its rule). Rules
// that only inform (lazy-optimizer-state, optimizer-omitted) have none.
var ruleErrors = []struct {
	rule string
	err  error
}{
	{RulePartialOptimizer, ErrPartialOptimizerState},
	{RuleLayoutMismatch, ErrLayoutMismatch},
	{RuleShardCoverage, planner.ErrCoverage},
	{RuleChecksum, ErrChecksum},
	{RuleUncommitted, ErrIncomplete},
	{RuleMissingKeys, ErrMissingKeys},
	{RuleMismatch, ErrTargetMismatch},
	{RuleMissingObject, ErrMissingObject},
	{RuleObjectSize, ErrMissingObject},
}

// Rules lists every rule a load can fail by (RuleOf's answers), in
// RuleOf's order.
func Rules() []string {
	var out []string
	seen := map[error]bool{}
	for _, re := range ruleErrors {
		if !seen[re.err] {
			seen[re.err] = true
			out = append(out, re.rule)
		}
	}
	return out
}

// RuleError returns the sentinel error a load fails with where Verify
// reports a problem of rule (so that a caller that chose a checkpoint by
// verifying it can raise the error a load would have): ErrIncomplete for
// uncommitted prefixes and rules of no sentinel of their own.
func RuleError(rule string) error {
	for _, re := range ruleErrors {
		if re.rule == rule {
			return re.err
		}
	}
	return ErrIncomplete
}

// RuleOf names the resume rule err breaks ("" for none): what tells apart
// errors of one class (a partial optimizer state and a checksum failure
// are both bad checkpoints) across the C ABI.
func RuleOf(err error) string {
	var cov *planner.CoverageError
	if errors.As(err, &cov) {
		return RuleShardCoverage
	}
	for _, re := range ruleErrors {
		if errors.Is(err, re.err) {
			return re.rule
		}
	}
	return ""
}

package loader_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/planner"
)

// Both directions of the one rule mapping agree: the error of a rule is
// named by that rule, wrapped or not.
func TestRuleOfAndRuleErrorAgree(t *testing.T) {
	for _, rule := range loader.Rules() {
		err := fmt.Errorf("load x: %w", loader.RuleError(rule))
		assert.Equal(t, rule, loader.RuleOf(err), "rule %s", rule)
	}
	assert.Equal(t, loader.RuleShardCoverage, loader.RuleOf(fmt.Errorf("x: %w", &planner.CoverageError{Key: "w"})))
	assert.Equal(t, "", loader.RuleOf(fmt.Errorf("disk on fire")))
	assert.Equal(t, loader.ErrMissingObject, loader.RuleError(loader.RuleObjectSize))
	assert.Equal(t, loader.ErrIncomplete, loader.RuleError("no-such-rule"))
}

// testdata/rules.txt lists the rules a load fails by, one per line: the
// names the C ABI gives Python, whose exception table
// (python/ckptkit/errors.py, _BY_RULE) python/tests/test_errors.py checks
// against this file. CKPTKIT_WRITE_RULES=1 rewrites it.
func TestRulesFileIsCurrent(t *testing.T) {
	want := strings.Join(loader.Rules(), "\n") + "\n"
	if os.Getenv("CKPTKIT_WRITE_RULES") == "1" {
		require.NoError(t, os.WriteFile("testdata/rules.txt", []byte(want), 0o644))
	}
	got, err := os.ReadFile("testdata/rules.txt")
	require.NoError(t, err)
	require.Equal(t, want, string(got), "testdata/rules.txt is out of date: CKPTKIT_WRITE_RULES=1 go test -run TestRulesFileIsCurrent ./loader")
}

package diff

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Values saved by two formats (Python's json.dumps in native checkpoints,
// the decoded pickle of a DCP item re-encoded by Go) differ in spelling,
// not in value.
func TestSameValue(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{`0`, `0.0`, true},
		{`[0.9, 0.999]`, `[0.9,0.999]`, true},
		{`{"lr": 0.001, "betas": [0.9, 0.95], "weight_decay": 0.0}`, `{"betas":[0.9,0.95],"lr":1e-3,"weight_decay":0}`, true},
		{`9007199254740993`, `9007199254740992`, false}, // beyond float64: compared exactly
		{`0.1`, `0.10000001`, false},
		{`[1, 2]`, `[2, 1]`, false},
		{`{"a": 1}`, `{"a": 1, "b": 2}`, false},
		{`"0"`, `0`, false},
		{`true`, `1`, false},
		{`null`, `null`, true},
		{`1 2`, `1`, false},
		{"PK\x03\x04opaque", "PK\x03\x04opaque", true},
		{"PK\x03\x04opaque", "PK\x03\x04other", false},
	} {
		assert.Equal(t, c.same, sameValue([]byte(c.a), []byte(c.b)), "%s vs %s", c.a, c.b)
	}
}

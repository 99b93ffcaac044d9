package metadata

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// The member table of docs/FORMAT.md lists exactly the members the decoder
// knows, each marked required or optional as the decoder enforces it: a
// field added to the Go types without a row (or the reverse) fails here.
func TestFormatDocMemberTable(t *testing.T) {
	doc, err := os.ReadFile("../docs/FORMAT.md")
	require.NoError(t, err)
	got := map[string]bool{}
	for _, r := range regexp.MustCompile("(?m)^\\| `([a-z_0-9.\\[\\]]+)` \\| [^|]+ \\| (required|optional) \\|").FindAllStringSubmatch(string(doc), -1) {
		got[r[1]] = r[2] == "required"
	}
	want := map[string]bool{}
	var walk func(prefix string, s *schema)
	walk = func(prefix string, s *schema) {
		for _, m := range s.members {
			want[prefix+m.name] = m.required
			switch {
			case m.kind == kindObject:
				walk(prefix+m.name+".", m.obj)
			case m.kind == kindArray && m.elem == kindObject:
				walk(prefix+m.name+"[].", m.obj)
			}
		}
	}
	walk("", topSchema)
	require.Equal(t, want, got)
}

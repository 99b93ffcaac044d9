// Package readme_test holds the library example of README.md as a
// compiled, run Example, and the test that keeps the two identical.
package readme_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's library snippet is example_test.go, byte for byte.
func TestREADMEExampleIsExampleTest(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- example: internal/readme/example_test.go -->\n```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```go block after <!-- example: internal/readme/example_test.go -->")
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(m[1]), string(src); got != want {
		t.Fatalf("README.md's library example differs from internal/readme/example_test.go; copy the file into the README.\nREADME:\n%s\nfile:\n%s", firstDiff(got, want), firstDiff(want, got))
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range al {
		if i >= len(bl) || al[i] != bl[i] {
			return al[i]
		}
	}
	return "(end)"
}

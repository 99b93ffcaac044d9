// Package readme_test holds the library example of README.md as a
// compiled, run Example, and the test that keeps the two identical.
package readme_test

import (
	"os"
	"os/exec"
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

// scripts/torch-env.sh run passes every variable README's environment table
// names into the chroot (where the Python suite runs), checked with the
// trixie environment when it is built.
func TestTorchEnvPassesREADMEEnvironment(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	table := regexp.MustCompile("(?s)\nEnvironment:\n\n(\\|.*?)\n\n").FindSubmatch(readme)
	if table == nil {
		t.Fatal(`README.md has no table after "Environment:"`)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]*_[A-Z0-9_]+)(=[^`]*)?`").FindAllSubmatch(table[1], -1) {
		names[string(m[1])] = true
	}
	if len(names) < 10 {
		t.Fatalf("found only %d variables in README's environment table: %v", len(names), names)
	}
	if os.Geteuid() != 0 {
		t.Skip("torch-env.sh run needs root (chroot)")
	}
	if err := exec.Command("bash", "../../scripts/torch-env.sh", "status").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the torch environment is not built")
		}
		t.Skip("the torch environment is not built (scripts/torch-env.sh build)")
	}
	cmd := exec.Command("bash", "scripts/torch-env.sh", "run", "env")
	cmd.Dir = "../.."
	cmd.Env = os.Environ()
	for n := range names {
		cmd.Env = append(cmd.Env, n+"=passed-"+strings.ToLower(n))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torch-env.sh run env: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	for n := range names {
		if got[n] != "passed-"+strings.ToLower(n) {
			t.Errorf("%s (README's environment table) is not passed into the torch environment: got %q", n, got[n])
		}
	}
}

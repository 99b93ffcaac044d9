package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

var (
	schemaOnce sync.Once
	cliSchema  *jsonschema.Schema
	schemaErr  error
)

// documentedSchema compiles the JSON Schema block of docs/CLI.md.
func documentedSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	schemaOnce.Do(func() {
		raw, err := os.ReadFile("../../docs/CLI.md")
		if err != nil {
			schemaErr = err
			return
		}
		m := regexp.MustCompile("(?s)\n```json\n(.*?)\n```").FindSubmatch(raw)
		if m == nil {
			schemaErr = os.ErrNotExist
			return
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(m[1])))
		if err != nil {
			schemaErr = err
			return
		}
		c := jsonschema.NewCompiler()
		if schemaErr = c.AddResource("cli.schema.json", doc); schemaErr != nil {
			return
		}
		cliSchema, schemaErr = c.Compile("cli.schema.json")
	})
	require.NoError(t, schemaErr, "the schema block of docs/CLI.md")
	return cliSchema
}

// cliDoc is the part of a --json document the tests read directly.
type cliDoc struct {
	SchemaVersion int        `json:"schema_version"`
	Command       string     `json:"command"`
	Error         *errorJSON `json:"error"`
}

// validDocument checks that stdout is exactly one JSON document valid
// against the documented schema, and returns its header.
func validDocument(t *testing.T, stdout string) cliDoc {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 1, "one JSON document, one line: %q", stdout)
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(lines[0]))
	require.NoError(t, err, stdout)
	require.NoError(t, documentedSchema(t).Validate(inst), "against docs/CLI.md: %s", stdout)
	var d cliDoc
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &d))
	require.Equal(t, schemaVersion, d.SchemaVersion)
	return d
}

// Every command's --json output, on success and on the failures that
// still have a result, validates against the schema in docs/CLI.md.
func TestEveryCommandsJSONMatchesTheDocumentedSchema(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	other := filepath.Join(dir, "other")
	trainJSON(t, run, "--steps", "6", "--save-every", "3", "--ranks", "2")
	trainJSON(t, other, "--steps", "3", "--save-every", "3", "--seed", "9")
	step6 := filepath.Join(run, "step-00000006")
	seen := map[string]bool{}
	cases := []struct {
		args []string
		code int
	}{
		{[]string{"train", filepath.Join(dir, "t"), "--steps", "3", "--save-every", "3"}, 0},
		{[]string{"train", run, "--steps", "3", "--resume"}, 0}, // already past: a note, no loss
		{[]string{"inspect", step6}, 0},
		{[]string{"inspect", "--hash", run}, 0},
		{[]string{"inspect", "../../interop/torchdcp/testdata/dense"}, 0},
		{[]string{"verify", step6}, 0},
		{[]string{"verify", "--deep", step6}, 0},
		{[]string{"latest", run}, 0},
		{[]string{"ls", run}, 0},
		{[]string{"gc", run, "--keep-last", "1", "--grace", "0s", "--dry-run"}, 0},
		{[]string{"diff", step6, step6}, 0},
		{[]string{"diff", "--tolerance", "0", step6, filepath.Join(other, "step-00000003")}, 1},
		{[]string{"convert", step6, filepath.Join(dir, "st"), "--to", "safetensors", "--shard-size", "1KB"}, 0},
		{[]string{"convert", step6, filepath.Join(dir, "native"), "--to", "ckptkit"}, 0},
		{[]string{"copy", step6, filepath.Join(dir, "copy")}, 0},
		{[]string{"plugins", "list"}, 0},
		{[]string{"conformance", "--short", "--run", "^storage/ranges$", "mem://schema-conf"}, 0},
		{[]string{"gc", run, "--keep-last", "1", "--grace", "0s"}, 0},
	}
	for _, c := range cases {
		args := append(append([]string{}, c.args...), "--json")
		code, out, errs := ckpt(t, args...)
		require.Equal(t, c.code, code, "ckpt %v: %s", args, errs)
		d := validDocument(t, out)
		require.Equal(t, c.code != 0, d.Error != nil, "ckpt %v: error member iff it failed: %s", args, out)
		seen[d.Command] = true
	}
	for _, sub := range newRootCmd(&invocation{}).Commands() {
		for _, c := range append(sub.Commands(), sub) {
			if c.Flags().Lookup("json") != nil {
				require.True(t, seen[commandName(c)], "command %q has --json and no case here", commandName(c))
			}
		}
	}
}

// withJSON adds --json to a command line, right after the command word so
// that it is parsed before a bad flag.
func withJSON(args []string) []string {
	if strings.HasPrefix(args[0], "-") {
		return append(append([]string{}, args...), "--json")
	}
	return append([]string{args[0], "--json"}, args[1:]...)
}

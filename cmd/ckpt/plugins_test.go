package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The CLI loads a real plugin process from --plugin-dir, lists it, and
// trains against its scheme.
func TestPluginsThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the example plugin")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "memplugin"), "github.com/ckptkit/ckptkit/plugins/examples/memplugin")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build memplugin: %s", out)

	code, stdout, stderr := ckpt(t, "--plugin-dir", dir, "plugins", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var doc pluginsOutput
	require.NoError(t, json.Unmarshal([]byte(stdout), &doc))
	infos := doc.Plugins
	require.Len(t, infos, 1)
	require.Equal(t, []string{"memplug"}, infos[0].Schemes)
	require.Len(t, infos[0].SHA256, 64)

	code, stdout, stderr = ckpt(t, "--plugin-dir", dir, "train", "--url", "memplug://bucket/run", "--steps", "6", "--save-every", "3", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"checkpoints":["memplug://bucket/run/step-00000003","memplug://bucket/run/step-00000006"]`)

	code, _, stderr = ckpt(t, "train", "--url", "memplug://bucket/run", "--steps", "1")
	require.Equal(t, 2, code, "without --plugin-dir the scheme is unknown")
	require.Contains(t, stderr, "registered schemes")
}

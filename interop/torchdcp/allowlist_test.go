package torchdcp

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pythonAllowList is the allow-list ckptkit's Python reader checks bytes
// items with (python/ckptkit/torch/_restricted.py reads it).
var pythonAllowList = filepath.Join("..", "..", "python", "ckptkit", "torch", "pickle_allowlist.json")

// allowListJSON renders the Go allow-list as pickle_allowlist.json holds
// it: {"globals": {module: {name: kind}}}.
func allowListJSON() map[string]map[string]map[string]string {
	g := map[string]map[string]string{}
	for module, names := range allowList {
		g[module] = map[string]string{}
		for name, pg := range names {
			g[module][name] = kindNames[pg.kind]
		}
	}
	return map[string]map[string]map[string]string{"globals": g}
}

// The Python reader's allow-list is the Go unpickler's, global for global
// and kind for kind. CKPTKIT_WRITE_ALLOWLIST=1 rewrites the JSON from Go.
func TestAllowListMatchesPython(t *testing.T) {
	want := allowListJSON()
	if os.Getenv("CKPTKIT_WRITE_ALLOWLIST") == "1" {
		out, err := json.MarshalIndent(want, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(pythonAllowList, append(out, '\n'), 0o644))
	}
	raw, err := os.ReadFile(pythonAllowList)
	require.NoError(t, err)
	var got map[string]map[string]map[string]string
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, want, got, "%s differs from globals.go (CKPTKIT_WRITE_ALLOWLIST=1 go test -run TestAllowListMatchesPython ./interop/torchdcp rewrites it)", pythonAllowList)
	for _, k := range kindNames {
		assert.NotEmpty(t, k)
	}
	assert.Len(t, kindNames, int(kindDType)+1, "every kind has a name")
}

package conformance

import (
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEmbeddedDCPFixturesMatchTheirSources fails when an embedded DCP
// checkpoint drifts from the real one it was copied from
// (testdata/dcp/README.md): the DCP fixtures of interop/torchdcp/testdata.
func TestEmbeddedDCPFixturesMatchTheirSources(t *testing.T) {
	for name, src := range map[string]string{
		"lazy_moe2":                  "../interop/torchdcp/testdata/torch2.6/lazy_moe2",
		"sparse_optim":               "../interop/torchdcp/testdata/sparse_optim",
		"partial_optim":              "../interop/torchdcp/testdata/partial_optim",
		"torch214_adafactor":         "../interop/torchdcp/testdata/torch2.14/adafactor",
		"torch214_muon_adamw":        "../interop/torchdcp/testdata/torch2.14/muon_adamw",
		"torch214_adafactor_partial": "../interop/torchdcp/testdata/torch2.14/adafactor_partial",
	} {
		for _, obj := range []string{dcpMetadataKey, "__0_0.distcp"} {
			want, err := os.ReadFile(filepath.Join(src, obj))
			require.NoError(t, err, "the source of the embedded %s", name)
			got, err := dcpFixtures.ReadFile(path.Join(dcpRoot, name, obj))
			require.NoError(t, err)
			require.Equal(t, want, got, "embedded %s/%s differs from %s", name, obj, src)
		}
	}
}

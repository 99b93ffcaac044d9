package conformance

import (
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEmbeddedDCPFixturesMatchTheSharedOnes fails when an embedded DCP
// checkpoint drifts from the real one it was copied from
// (testdata/dcp/README.md): ../shared/fixtures next to the repository root,
// which tests and CI both have.
func TestEmbeddedDCPFixturesMatchTheSharedOnes(t *testing.T) {
	for name, src := range map[string]string{
		"lazy_moe2":                  "../../shared/fixtures/dcp-torch2/lazy_moe2",
		"sparse_optim":               "../../shared/fixtures/dcp-torch1.13/sparse_optim",
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

// Package layers holds the module's import rules as data: every package has
// a level, and a package may import only packages of a lower level (the
// layer table of docs/DESIGN.md, "Layers"). Its test reads every non-test
// Go file of the module and fails on an import that runs back up, and on a
// package that has no level yet, so a new package is placed on purpose.
package layers

// Level is a package's place in the stack: 0 is the bottom.
type Level int

// Levels maps each package of the module (its path relative to the module
// root) to its level. Leaves first, the CLI last; test kits (packages only
// tests import) sit at the top, below the CLI, so they may use anything
// they test.
var Levels = map[string]Level{
	// Leaves: the error taxonomy, then what only needs it.
	"ckpterr":           0,
	"progress":          0,
	"keys":              1,
	"internal/crc32c":   1,
	"internal/bufpool":  1,
	"internal/bytesize": 1,
	"statedict":         1,
	"plugins/proto":     1,

	// Storage and data model.
	"backend":           2,
	"metadata":          2,
	"internal/detbytes": 2,
	"internal/trainer":  2,

	"backend/fs":            3,
	"backend/stall":         3,
	"backend/s3":            4, // imports backend/stall
	"backend/gcs":           4, // imports backend/stall
	"backend/mem":           3,
	"backend/instrument":    3,
	"planner":               3,
	"coordinator":           3,
	"interop/torchdcp":      3,
	"plugins/internal/shm":  3,
	"plugins/internal/wire": 3,

	// Resume and save; the plugin host and SDK.
	"loader":                              4,
	"saver":                               4,
	"plugins/host":                        4,
	"plugins/sdk":                         4,
	"plugins/examples/memplugin/memstore": 4,

	// Operations on stored checkpoints.
	"catalog":                 5,
	"transfer":                5,
	"ops/diff":                5,
	"convert/native":          5,
	"convert/safetensors":     5,
	"internal/testkit/damage": 5, // the conformance suite's damage helpers

	"ops/gc": 6,

	// The run: choosing, saving, resuming, falling back and retention.
	"run": 7,

	// Clients of the core: the C ABI, example plugins, benchmarks, test kits.
	"capi":                        8,
	"plugins/examples/fsplugin":   8,
	"plugins/examples/memplugin":  8,
	"bench/cmd/ckptbench":         8,
	"conformance":                 8, // the suite every backend runs: storage, resume and run rules
	"internal/testkit/storetest":  9,
	"internal/testkit/ckpttest":   10,
	"internal/testkit/faultproxy": 8,
	"internal/reliability":        8,
	"internal/layers":             8,

	// The CLI may import everything.
	"cmd/ckpt": 11,
}

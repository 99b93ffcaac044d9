package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/conformance"
)

// lyingDriver reports missing objects with an unclassified error, which
// storage/not-found must catch.
type lyingDriver struct{ backend.Driver }

func (d lyingDriver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	a, err := d.Driver.Stat(ctx, key)
	if err != nil && d.Driver.ErrorCode(err) == backend.CodeNotFound {
		return a, errors.New("backend said no")
	}
	return a, err
}

func init() {
	backend.MustRegister("conftest-liar", func(context.Context, *url.URL) (backend.Driver, string, error) {
		return lyingDriver{mem.New()}, "", nil
	})
}

var totalRow = regexp.MustCompile(`(?m)^total\s+(\d+) pass, (\d+) skip, 0 fail`)

func TestConformanceCommandOnDirectory(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "conf-scratch")
	code, out, errs := ckpt(t, "conformance", "--short", scratch)
	require.Equal(t, 0, code, "stderr: %s\n%s", errs, out)
	assert.Contains(t, out, "== conformance summary ==")
	assert.Regexp(t, `(?m)^case\s+file$`, out)
	for _, name := range []string{"storage/not-found", "storage/list-sorted@prefix", "checkpoint/reshard-round-trip"} {
		assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(name)+`\s+pass$`, out)
	}
	m := totalRow.FindStringSubmatch(out)
	require.NotNil(t, m, "totals row: %s", out)
	// Every case passes on a directory but the four runs of
	// storage/wrong-crc32c*: fs verifies no declared CRC32C.
	assert.Equal(t, fmt.Sprint(len(conformance.Cases())+1-4), m[1], "every case passes on a directory")
	assert.Equal(t, "4", m[2])
	assert.Regexp(t, `(?m)^storage/wrong-crc32c\s+skip$`, out)
	entries, err := os.ReadDir(scratch)
	require.NoError(t, err)
	assert.Empty(t, entries, "the run prefix must be deleted afterwards")
}

func TestConformanceCommandOnMemoryJSON(t *testing.T) {
	code, out, errs := ckpt(t, "conformance", "--short", "--json", "mem://")
	require.Equal(t, 0, code, "stderr: %s", errs)
	var rep conformanceReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Equal(t, "mem", rep.Backend)
	assert.Len(t, rep.Cases, len(conformance.Cases())+1)
	for _, c := range rep.Cases {
		assert.NotEqual(t, string(conformance.StatusFail), c.Status, "%s: %s", c.Case, c.Message)
	}
	assert.Regexp(t, `^ckptkit-conformance-[0-9a-f]{12}$`, rep.Prefix)
	assert.Positive(t, rep.Removed)
}

func TestConformanceCommandFailsOnBrokenBackend(t *testing.T) {
	code, out, errs := ckpt(t, "conformance", "--run", `^storage/(not-found|ranges)$`, "conftest-liar://")
	require.Equal(t, 1, code, "stderr: %s\n%s", errs, out)
	assert.Regexp(t, `(?m)^storage/not-found\s+FAIL$`, out)
	assert.Regexp(t, `(?m)^storage/ranges\s+pass$`, out)
	assert.Contains(t, out, "FAIL conftest-liar storage/not-found:")
	assert.Contains(t, errs, "1 of 3 conformance case(s) failed")
}

func TestConformanceCommandUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"conformance"},
		{"conformance", "mem://", "extra"},
		{"conformance", "nope://bucket"},
		{"conformance", "--run", "(", "mem://"},
	} {
		code, _, _ := ckpt(t, args...)
		assert.Equal(t, 2, code, "%v", args)
	}
}

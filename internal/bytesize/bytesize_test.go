package bytesize_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/bytesize"
)

func TestParseUnitRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1048576", 1 << 20},
		{"123B", 123},
		{"16MiB", 16 << 20},
		{"16MB", 16_000_000},
		{"16mib", 16 << 20},
		{"16mb", 16_000_000},
		{"16 MiB", 16 << 20},
		{" 5GiB ", 5 << 30},
		{"5GB", 5_000_000_000},
		{"512KiB", 512 << 10},
		{"512KB", 512_000},
		{"512kB", 512_000},
		{"2TiB", 2 << 40},
		{"2TB", 2_000_000_000_000},
		{"1.5GiB", 3 << 29},
		{"1.5MB", 1_500_000},
		{"4Mi", 4 << 20},
		{"4M", 4_000_000},
		{"1,000", 1000},
	} {
		got, err := bytesize.Parse(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{"", " ", "-1", "-5MiB", "+5", "MiB", "5 XB", "5MiBs", "1e3", "0x10", "NaN", "Inf", "8EiB", "99999999999999999999"} {
		_, err := bytesize.Parse(in)
		require.Error(t, err, "%q", in)
		assert.True(t, errors.Is(err, bytesize.ErrNotASize), "%q: %v", in, err)
		assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err), "%q", in)
		assert.Contains(t, err.Error(), "size \""+in+"\"")
	}
}

package metadata_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

// Regression (issue 16): one bit flipped in "iteration":3 (or world_size,
// optimizer_state_entries, version) decoded to a plausible value and the
// checkpoint resumed at the wrong step. The seal catches every single-bit
// flip anywhere in the document, before decoding.
func TestSealCatchesEverySingleBitFlip(t *testing.T) {
	enc, err := metadata.Encode(sample())
	require.NoError(t, err)
	_, err = metadata.Decode(enc)
	require.NoError(t, err)
	// The trailing newline is white space a flip may turn into other
	// white space; every other byte counts.
	body := len(strings.TrimRight(string(enc), "\n"))
	flipped := 0
	for i := range body {
		for bit := range 8 {
			bad := []byte(string(enc))
			bad[i] ^= 1 << bit
			_, err := metadata.Decode(bad)
			require.Error(t, err, "byte %d (%q) bit %d flipped was accepted", i, enc[i], bit)
			flipped++
		}
	}
	require.Equal(t, 8*body, flipped)
}

func TestSealVersionRules(t *testing.T) {
	enc, err := metadata.Encode(sample())
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(string(enc), "}\n"))
	i := strings.LastIndex(string(enc), `,"metadata_crc32c":`)
	require.Positive(t, i)
	unsealed := string(enc[:i]) + "}\n"

	// 1.1 without the seal: refused, naming the member.
	_, err = metadata.Decode([]byte(unsealed))
	require.ErrorIs(t, err, metadata.ErrInvalid)
	require.Contains(t, err.Error(), "$.metadata_crc32c is missing")

	// 1.0 without it: read as before (checkpoints written before 1.1).
	legacy := strings.Replace(unsealed, `"version":"1.1"`, `"version":"1.0"`, 1)
	c, err := metadata.Decode([]byte(legacy))
	require.NoError(t, err)
	require.Equal(t, int64(3), c.Training.Iteration)
	// ... and Encode writes a 1.0 document as 1.0, unsealed.
	again, err := metadata.Encode(c)
	require.NoError(t, err)
	require.Equal(t, legacy, string(again))

	// 1.0 with a seal: checked all the same ("1.1" -> "1.0" is one bit).
	_, err = metadata.Decode([]byte(strings.Replace(string(enc), `"version":"1.1"`, `"version":"1.0"`, 1)))
	require.ErrorIs(t, err, metadata.ErrInvalid)
	require.Contains(t, err.Error(), "stored CRC32C")

	// Not the last member, or written another way: refused.
	moved := strings.Replace(unsealed, `"world_size":2`, `"world_size":2,"metadata_crc32c":5`, 1)
	_, err = metadata.Decode([]byte(moved))
	require.ErrorIs(t, err, metadata.ErrInvalid)
	spaced := strings.Replace(string(enc), `,"metadata_crc32c":`, `, "metadata_crc32c":`, 1)
	_, err = metadata.Decode([]byte(spaced))
	require.ErrorIs(t, err, metadata.ErrInvalid)
	for _, tail := range []string{`0123}`, `4294967296}`, `-1}`, `1}}`, `1,"x":1}`} {
		_, err = metadata.Decode([]byte(string(enc[:i]) + `,"metadata_crc32c":` + tail))
		require.ErrorIs(t, err, metadata.ErrInvalid, tail)
	}

	// Seal replaces a seal: sealing twice is sealing once.
	twice, err := metadata.Seal(enc)
	require.NoError(t, err)
	require.Equal(t, string(enc), string(twice))
	_, err = metadata.Seal([]byte(`{}`))
	require.ErrorIs(t, err, metadata.ErrInvalid)
}

package transfer

import (
	"bytes"
	"hash/crc32"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// Regression (review): two entries sharing bytes (tied weights) made the
// single running CRC report a false mismatch when reads were split.
func TestCheckingReaderOverlappingRanges(t *testing.T) {
	data := []byte("0123456789abcdef")
	crc := func(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }
	ranges := []crcRange{
		{key: "a", offset: 0, length: 10, crc: crc(data[0:10])},
		{key: "b", offset: 4, length: 8, crc: crc(data[4:12])},
		{key: "c", offset: 4, length: 2, crc: crc(data[4:6])},
		{key: "d", offset: 12, length: 4, crc: crc(data[12:16])},
	}
	r := &checkingReader{r: iotest.OneByteReader(bytes.NewReader(data)), ranges: ranges, object: "o", progress: func(int) {}}
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Equal(t, len(ranges), r.first, "every range was checked")

	ranges[1].crc ^= 1
	r = &checkingReader{r: iotest.HalfReader(bytes.NewReader(data)), ranges: ranges, object: "o", progress: func(int) {}}
	_, err = io.ReadAll(r)
	require.ErrorContains(t, err, `key "b"`)
}

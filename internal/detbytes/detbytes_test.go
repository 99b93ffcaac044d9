package detbytes_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/detbytes"
)

// Any range of the stream equals the same range of the whole stream, also
// when read in odd-sized pieces, and seeds give different streams.
func TestRangesAgreeWithTheWholeStream(t *testing.T) {
	whole := detbytes.Bytes(7, 1000)
	for _, r := range [][2]int{{0, 1}, {3, 5}, {7, 9}, {8, 8}, {13, 500}, {999, 1}, {0, 1000}} {
		require.Equal(t, whole[r[0]:r[0]+r[1]], detbytes.At(7, int64(r[0]), r[1]), "range %v", r)
	}
	var got bytes.Buffer
	rd := detbytes.NewReader(7, 1000)
	buf := make([]byte, 13)
	for {
		n, err := rd.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	require.Equal(t, whole, got.Bytes())
	require.NotEqual(t, whole[:64], detbytes.Bytes(8, 64))
	// Pinned, so the stream (and every fixture derived from it) cannot
	// change unnoticed.
	require.Equal(t, []byte{0xc1, 0x5c, 0x02, 0x89, 0xec, 0x2d, 0x0a, 0x91}, detbytes.Bytes(1, 8))
}

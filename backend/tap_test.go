package backend_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
)

// choppy makes every reader its driver opens return short reads of odd
// sizes (as a socket does), alternating with 1-byte reads.
type choppy struct{ backend.Driver }

type choppyReader struct {
	io.ReadCloser
	odd bool
}

func (c *choppyReader) Read(p []byte) (int, error) {
	c.odd = !c.odd
	if c.odd {
		return iotest.OneByteReader(c.ReadCloser).Read(p)
	}
	return c.ReadCloser.Read(p[:min(len(p), 77777)])
}

// Remain forwards the driver reader's announced length, if any.
func (c *choppyReader) Remain() int64 {
	if r, ok := c.ReadCloser.(backend.Remainer); ok {
		return r.Remain()
	}
	return -1
}

func (c choppy) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	rc, err := c.Driver.NewRangeReader(ctx, key, offset, length)
	if err != nil {
		return nil, err
	}
	return &choppyReader{ReadCloser: rc}, nil
}

// crcTap hashes what it is given and remembers it.
type crcTap struct {
	crc  uint32
	seen bytes.Buffer
}

func (t *crcTap) Write(p []byte) (int, error) {
	t.crc = crc32.Update(t.crc, crc32.MakeTable(crc32.Castagnoli), p)
	return t.seen.Write(p)
}

func (t *crcTap) Reset() { t.crc = 0; t.seen.Reset() }

// A tapped scattered read whose stream arrives in many short reads still
// fills every destination exactly and hands the tap every byte once, in
// order (the loader's chunk CRCs depend on it); a range past the object's
// end is a short object, not a silent partial fill.
func TestTappedReadOfShortReads(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://")
	require.NoError(t, err)
	data := make([]byte, 3*backend.TapPiece+12345)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}))
	st = st.WithDriver(choppy{st.Driver()})

	const off = 1000
	dsts := [][]byte{make([]byte, 10), make([]byte, backend.TapPiece+1), make([]byte, 2*backend.TapPiece)}
	tap := &crcTap{}
	require.NoError(t, st.ReadRangeInto(ctx, "obj", off, dsts, tap))
	want := data[off : off+10+backend.TapPiece+1+2*backend.TapPiece]
	require.True(t, bytes.Equal(want, bytes.Join(dsts, nil)), "destinations")
	require.True(t, bytes.Equal(want, tap.seen.Bytes()), "tapped bytes")
	require.Equal(t, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)), tap.crc)

	err = st.ReadRangeInto(ctx, "obj", int64(len(data))-5, [][]byte{make([]byte, 9)}, tap)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

package ckpttest

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/interop/torchdcp"
)

// ForbiddenGlobalPickle is a pickle (protocol 2) that would run
// posix.system("id") if it were evaluated: GLOBAL, an argument tuple,
// REDUCE.
func ForbiddenGlobalPickle() []byte {
	p := []byte("\x80\x02cposix\nsystem\nX")
	p = binary.LittleEndian.AppendUint32(p, 2)
	return append(p, "id\x85R."...) // "id", TUPLE1, REDUCE, STOP
}

// PlantForbiddenGlobal overwrites, in place, the bytes item key of the DCP
// checkpoint in dir (a local copy) with a torch.save archive of the same
// length whose pickle is ForbiddenGlobalPickle, so the checkpoint's
// .metadata still describes it: a hostile checkpoint that must be refused,
// naming posix.system, and never evaluated.
func PlantForbiddenGlobal(t testing.TB, dir, key string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, torchdcp.ObjectKey))
	require.NoError(t, err)
	md, err := torchdcp.DecodeMetadata(raw)
	require.NoError(t, err)
	b := md.BytesValue(key)
	require.NotNil(t, b, "no bytes item %q in %s", key, dir)

	build := func(pad int) []byte {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for _, e := range []struct {
			name string
			data []byte
		}{{"archive/data.pkl", ForbiddenGlobalPickle()}, {"archive/version", []byte("3\n")}} {
			w, err := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Store})
			require.NoError(t, err)
			_, err = w.Write(e.data)
			require.NoError(t, err)
		}
		require.NoError(t, zw.SetComment(strings.Repeat(" ", pad))) // the comment pads the archive to size
		require.NoError(t, zw.Close())
		return buf.Bytes()
	}
	item := build(0)
	require.LessOrEqual(t, int64(len(item)), b.Length, "item %q is too short to replace", key)
	item = build(int(b.Length) - len(item))
	require.Equal(t, b.Length, int64(len(item)))

	f, err := os.OpenFile(filepath.Join(dir, b.Object), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(item, b.Offset)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

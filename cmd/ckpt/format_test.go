package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/metadata"
)

// Regression (issues 12 and 16): hostile metadata reaches the commands
// through the one decoder, so verify --deep, inspect --hash and resume all
// refuse it as a bad checkpoint (exit 1) naming the JSON path, instead of
// passing (a float32 [2^62] with an empty chunk), folding case ("Shape") or
// reporting a missing object for "../x".
func TestHostileMetadataThroughTheCLI(t *testing.T) {
	dir, st, good := trainedMetadata(t)
	ctx := context.Background()
	md, err := metadata.Decode(good)
	require.NoError(t, err)
	first := md.Tensors[0]
	require.NotEmpty(t, first.Chunks)

	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"case-folded member", `"shape":`, `"Shape":`, `$.tensors[0].Shape: member "Shape" differs from "shape" only in case`},
		{"object key escaping the checkpoint", `"object":"` + first.Chunks[0].Object + `"`, `"object":"../` + first.Chunks[0].Object + `"`, `$.tensors[0].chunks[0] ("` + first.Key + `").object: key "../`},
		{"duplicate member", `"world_size":`, `"world_size":1,"world_size":`, `$.world_size: duplicate member`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, string(good), tc.old)
			// Sealed again, so that the strict rule is what refuses it.
			bad, err := metadata.Seal([]byte(strings.Replace(string(good), tc.old, tc.new, 1)))
			require.NoError(t, err)
			require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, bad, backend.PutOptions{}))
			t.Cleanup(func() { require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, good, backend.PutOptions{})) })
			for _, args := range [][]string{
				{"verify", "--deep", dir + "/step-00000003"},
				{"inspect", "--hash", dir + "/step-00000003"},
			} {
				code, out, errs := ckpt(t, args...)
				require.Equal(t, 1, code, "%v: %s%s", args, out, errs)
				require.Contains(t, out+errs, tc.want, "%v", args)
			}
		})
	}

	// The issue 16 document: one float32 tensor of shape [2^62] whose one
	// chunk is empty. Its size wraps to 0 bytes in int64 arithmetic.
	huge := *md
	huge.Tensors = append([]metadata.TensorEntry{{Key: "a.huge", DType: "float32", Shape: []int64{1 << 62},
		Chunks: []metadata.Chunk{{Offsets: []int64{0}, Sizes: []int64{0}, Object: first.Chunks[0].Object}}}}, md.Tensors...)
	_, err = metadata.Encode(&huge)
	require.ErrorIs(t, err, metadata.ErrInvalid, "Encode refuses it too")
	enc := strings.Replace(string(good), `"tensors":[`, `"tensors":[{"key":"a.huge","dtype":"float32","shape":[4611686018427387904],"chunks":[{"offsets":[0],"sizes":[0],"object":"`+first.Chunks[0].Object+`","offset":0,"length":0,"crc32c":0}]},`, 1)
	sealed, err := metadata.Seal([]byte(enc))
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, sealed, backend.PutOptions{}))
	code, out, errs := ckpt(t, "verify", "--deep", "--json", dir+"/step-00000003")
	require.Equal(t, 1, code, "%s%s", out, errs)
	require.Contains(t, out+errs, `$.tensors[0] ("a.huge"): shape [4611686018427387904] of float32 is over 2^63-1 bytes`)
	code, _, errs = ckpt(t, "train", "--url", dir, "--steps", "6", "--resume")
	require.Equal(t, 1, code, errs)
}

// Regression (issue 16): one bit flipped in "iteration":3 (to 2) passed
// verify --deep and resumed at the wrong step. The metadata's seal refuses
// it in verify, inspect and resume alike (exit 1, bad checkpoint).
func TestFlippedIterationBitIsCaught(t *testing.T) {
	dir, st, good := trainedMetadata(t)
	ctx := context.Background()
	i := strings.Index(string(good), `"iteration":3`)
	require.Positive(t, i)
	bad := []byte(string(good))
	bad[i+len(`"iteration":`)] ^= 1 // '3' -> '2'
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, bad, backend.PutOptions{}))
	for _, args := range [][]string{
		{"verify", "--deep", dir + "/step-00000003"},
		{"inspect", "--hash", dir + "/step-00000003"},
		{"train", "--url", dir, "--steps", "6", "--resume"},
	} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, 1, code, "%v: %s%s", args, out, errs)
		require.Contains(t, out+errs, "metadata_crc32c", "%v", args)
	}
}

// trainedMetadata trains 3 steps into a fresh run dir and returns it, the
// store of its step-3 checkpoint and that checkpoint's metadata bytes.
func trainedMetadata(t *testing.T) (string, *backend.Store, []byte) {
	t.Helper()
	dir := t.TempDir()
	trainJSON(t, "--url", dir, "--steps", "3", "--save-every", "3")
	ctx := context.Background()
	st, err := backend.Open(ctx, dir+"/step-00000003")
	require.NoError(t, err)
	good, err := st.ReadAll(ctx, metadata.ObjectKey, metadata.MaxSize)
	require.NoError(t, err)
	return dir, st, good
}

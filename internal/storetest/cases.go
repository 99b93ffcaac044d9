package storetest

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
)

// The functions below are test bodies both object store drivers run against
// their test server: each takes an empty scratch Store (see Scratch) and
// checks one behaviour through the portable API.

// RoundTrip writes objects with and without a declared CRC32C, reads them
// back, checks Stat and that an overwrite replaces.
func RoundTrip(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	data := []byte("hello, checkpoint")
	crc := crc32.Checksum(data, Castagnoli)
	require.NoError(t, st.PutBytes(ctx, "a/b.bin", data, backend.PutOptions{CRC32C: &crc}))
	assert.Equal(t, data, ReadAll(t, st, "a/b.bin"))
	attrs, err := st.Stat(ctx, "a/b.bin")
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), attrs.Size)
	assert.WithinDuration(t, time.Now(), attrs.ModTime, 5*time.Minute)
	if assert.NotNil(t, attrs.CRC32C, "server keeps the CRC32C") {
		assert.Equal(t, crc, *attrs.CRC32C)
	}

	// Without a declared CRC the driver computes one while streaming.
	require.NoError(t, st.Put(ctx, "c.bin", int64(len(data)), OnlyReader(bytes.NewReader(data)), backend.PutOptions{}))
	assert.Equal(t, data, ReadAll(t, st, "c.bin"))

	// Overwrite replaces.
	require.NoError(t, st.PutBytes(ctx, "a/b.bin", []byte("v2"), backend.PutOptions{}))
	assert.Equal(t, []byte("v2"), ReadAll(t, st, "a/b.bin"))
}

// WrongCRC32CRejected checks a write whose declared CRC32C does not match
// its body fails and publishes nothing.
func WrongCRC32CRejected(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	bad := uint32(12345)
	err := st.PutBytes(ctx, "bad.bin", []byte("payload"), backend.PutOptions{CRC32C: &bad})
	require.Error(t, err)
	_, err = st.Stat(ctx, "bad.bin")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

// RangedReads checks range reads inside, across and past the end of an
// object, and ReadRange's io.ErrUnexpectedEOF on a short object.
func RangedReads(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	data := GenBytes(7, 0, 1000)
	require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}))
	for _, tc := range []struct {
		name           string
		offset, length int64
		want           []byte
	}{
		{"whole", 0, -1, data},
		{"prefix", 0, 10, data[:10]},
		{"middle", 100, 50, data[100:150]},
		{"to end", 990, -1, data[990:]},
		{"clamped at end", 995, 100, data[995:]},
		{"last byte", 999, 1, data[999:]},
		{"at end", 1000, -1, nil},
		{"at end with length", 1000, 5, nil},
		{"past end", 5000, 10, nil},
		{"past end to end", 5000, -1, nil},
		{"zero length", 10, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := st.NewRangeReader(ctx, "obj", tc.offset, tc.length)
			require.NoError(t, err)
			got, err := io.ReadAll(rc)
			require.NoError(t, err)
			require.NoError(t, rc.Close())
			assert.Equal(t, len(tc.want), len(got))
			assert.True(t, bytes.Equal(tc.want, got))
		})
	}
	dst := make([]byte, 20)
	require.NoError(t, st.ReadRange(ctx, "obj", 500, dst))
	assert.Equal(t, data[500:520], dst)
	err := st.ReadRange(ctx, "obj", 990, dst)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// NotFound checks every read of a missing object is ErrNotFound and Exists
// reports false without a (transient) error.
func NotFound(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	_, err := st.Stat(ctx, "missing")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 0, -1)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 10, 5)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.NewRangeReader(ctx, "missing", 0, 0)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	_, err = st.ReadAll(ctx, "dir/missing", 0)
	assert.ErrorIs(t, err, backend.ErrNotFound)
	ok, err := st.Exists(ctx, "missing")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.NotErrorIs(t, err, backend.ErrTransient)
}

// DeleteMissingOK checks deleting a missing object succeeds, also twice.
func DeleteMissingOK(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	require.NoError(t, st.Delete(ctx, "never-written"))
	require.NoError(t, st.PutBytes(ctx, "x", []byte("x"), backend.PutOptions{}))
	require.NoError(t, st.Delete(ctx, "x"))
	require.NoError(t, st.Delete(ctx, "x"))
	_, err := st.Stat(ctx, "x")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

// ZeroLength checks empty objects: write, stat, read, ranged read and
// create-if-absent.
func ZeroLength(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "empty", nil, backend.PutOptions{}))
	attrs, err := st.Stat(ctx, "empty")
	require.NoError(t, err)
	assert.Zero(t, attrs.Size)
	assert.Empty(t, ReadAll(t, st, "empty"))
	rc, err := st.NewRangeReader(ctx, "empty", 0, 10)
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Empty(t, b)
	require.NoError(t, rc.Close())
	// Create-if-absent of an empty object.
	require.NoError(t, st.PutBytes(ctx, "empty2", nil, backend.PutOptions{IfNotExists: true}))
	err = st.PutBytes(ctx, "empty2", nil, backend.PutOptions{IfNotExists: true})
	assert.ErrorIs(t, err, backend.ErrAlreadyExists)
}

// UploadCase is one upload of Size generated bytes that goes wrong once At
// bytes have been read from the source.
type UploadCase struct {
	Name     string
	Size, At int64
}

// FailingSourceNeverPublishes overwrites an object with sources that fail,
// come up short or hold too much, one subtest per case, and checks the old
// contents survive every time.
func FailingSourceNeverPublishes(t *testing.T, st *backend.Store, cases []UploadCase) {
	ctx := context.Background()
	old := []byte("old contents")
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			key := strings.ReplaceAll(tc.Name, " ", "-")
			require.NoError(t, st.PutBytes(ctx, key, old, backend.PutOptions{}))
			err := st.Put(ctx, key, tc.Size, FailingSource(NewGen(1, tc.Size), tc.At), backend.PutOptions{})
			require.ErrorIs(t, err, ErrSource)
			AssertContent(t, st, key, old)

			// A source that is short without an error is a size mismatch.
			err = st.Put(ctx, key, tc.Size, OnlyReader(NewGen(1, tc.At)), backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch)
			AssertContent(t, st, key, old)

			// And so is one that holds more than declared.
			err = st.Put(ctx, key, tc.Size, OnlyReader(NewGen(1, tc.Size+1)), backend.PutOptions{})
			require.ErrorIs(t, err, backend.ErrSizeMismatch)
			AssertContent(t, st, key, old)
		})
	}
}

// CreateIfAbsent checks the second create-if-absent write of a key loses
// with a permanent ErrAlreadyExists and leaves the first one's content.
func CreateIfAbsent(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	require.True(t, st.Capabilities().CreateIfAbsent)
	require.NoError(t, st.PutBytes(ctx, "k", []byte("first"), backend.PutOptions{IfNotExists: true}))
	err := st.PutBytes(ctx, "k", []byte("second"), backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	assert.NotErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, []byte("first"), ReadAll(t, st, "k"))
}

// CreateIfAbsentRace has another writer create the key once after bytes of
// a size-byte create-if-absent upload are in flight: the upload must lose
// with ErrAlreadyExists and leave the other writer's object intact. Then it
// checks an existing key is refused up front and a free key is created.
func CreateIfAbsentRace(t *testing.T, st *backend.Store, size, after int64) {
	ctx := context.Background()
	winner := []byte("the other writer got here first")
	src := &HookReader{R: NewGen(5, size), After: after, Hook: func() error {
		return st.PutBytes(ctx, "race.bin", winner, backend.PutOptions{IfNotExists: true})
	}}
	err := st.Put(ctx, "race.bin", size, OnlyReader(src), backend.PutOptions{IfNotExists: true})
	require.True(t, src.Done, "the competing write ran mid-upload")
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	AssertContent(t, st, "race.bin", winner)

	// Existing before the upload starts: refused too.
	err = PutGen(ctx, st, "race.bin", 5, size, backend.PutOptions{IfNotExists: true})
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
	AssertContent(t, st, "race.bin", winner)

	// And a free key is created.
	require.NoError(t, PutGen(ctx, st, "free.bin", 5, size, backend.PutOptions{IfNotExists: true}))
	CheckGen(t, st, "free.bin", 5, size)
}

// CancelMidUploadPublishesNothing cancels each case's upload once At bytes
// have been read, one subtest per case, and checks the write fails promptly
// with context.Canceled and publishes nothing.
func CancelMidUploadPublishesNothing(t *testing.T, st *backend.Store, cases []UploadCase) {
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			key := strings.ReplaceAll(tc.Name, " ", "-")
			src := &HookReader{R: NewGen(9, tc.Size), After: tc.At, Hook: func() error { cancel(); return nil }}
			start := time.Now()
			err := st.Put(ctx, key, tc.Size, OnlyReader(src), backend.PutOptions{})
			require.Error(t, err)
			assert.ErrorIs(t, err, context.Canceled)
			assert.Less(t, time.Since(start), 20*time.Second)
			_, err = st.Stat(context.Background(), key)
			assert.ErrorIs(t, err, backend.ErrNotFound)
		})
	}
}

// SortedListing writes keys (each holding its own name) and checks List
// returns them sorted with their sizes, that listing "a/" returns underA,
// and that fn's error stops the listing and comes back unchanged.
func SortedListing(t *testing.T, st *backend.Store, keys, underA []string) {
	ctx := context.Background()
	for i, k := range keys {
		require.NoError(t, st.PutBytes(ctx, k, []byte(k), backend.PutOptions{}), "key %d", i)
	}
	var got []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error {
		got = append(got, o.Key)
		assert.Equal(t, int64(len(o.Key)), o.Size)
		return nil
	}))
	want := append([]string(nil), keys...)
	sort.Strings(want)
	assert.Equal(t, want, got)

	got = nil
	require.NoError(t, st.List(ctx, "a/", func(o backend.ObjectInfo) error { got = append(got, o.Key); return nil }))
	assert.Equal(t, underA, got)

	// fn's error stops the listing and comes back unchanged.
	stop := errors.New("stop")
	n := 0
	err := st.List(ctx, "", func(backend.ObjectInfo) error { n++; return stop })
	assert.ErrorIs(t, err, stop)
	assert.Equal(t, 1, n)
}

// InvalidKeysRejected checks writes to keys that escape the prefix or hold
// NUL fail with ErrInvalidKey.
func InvalidKeysRejected(t *testing.T, st *backend.Store) {
	ctx := context.Background()
	for _, k := range []string{"../escape", "/abs", "a/../b", "nul\x00"} {
		err := st.PutBytes(ctx, k, []byte("x"), backend.PutOptions{})
		assert.ErrorIs(t, err, backend.ErrInvalidKey, k)
	}
}

// Command capi is libckptkit: ckptkit's Go core as a C shared library
// (go build -buildmode=c-shared -o libckptkit.so ./capi), for the ctypes
// binding in python/ckptkit. docs/TORCH.md documents the ABI.
//
// Conventions of every call:
//   - The result is 0 on success and -1 on failure; on failure *cls receives
//     the ckpterr class number of the error (ckpterr.ClassOf), *rule a rule
//     name when the error is one of the resume rules (else NULL), and *msg
//     the message naming key, object and URL. Both strings are C memory the
//     caller frees with ckpt_free.
//   - Handles are opaque integers of a table of our own (handles.go): a
//     closed, stale, zero or random handle fails with a usage error, and
//     closing a handle waits for the calls in flight on it. No Go pointer
//     is handed out or kept by C after a call returns. Buffers passed in
//     are C memory the caller owns for the duration of the call only.
//   - A panic in the Go core is recovered in the export: the call fails
//     with class internal, the panic and its stack go to the log.
//   - Every long call takes a cancellation token first (ckpt_cancel_new;
//     0 for none): ckpt_cancel makes it stop promptly with class canceled.
//   - Every open takes the environment variables to use (a JSON object,
//     NULL for the process's own, which the Go runtime copied at load):
//     credentials, endpoints, regions, profiles, emulator hosts, CKPTKIT_*.
//   - Every call is safe to make from several threads at once.
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ckptkit/ckptkit/internal/crc32c"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"  // file://
	_ "github.com/ckptkit/ckptkit/backend/gcs" // gs://
	"github.com/ckptkit/ckptkit/backend/instrument"
	_ "github.com/ckptkit/ckptkit/backend/mem" // mem://
	_ "github.com/ckptkit/ckptkit/backend/s3"  // s3://
	"github.com/ckptkit/ckptkit/ckpterr"
	_ "github.com/ckptkit/ckptkit/interop/torchdcp" // DCP checkpoints
	"github.com/ckptkit/ckptkit/plugins/host"
)

// abiVersion is bumped on every incompatible change of the exported calls;
// the Python binding refuses a library of another version.
const abiVersion = 3

func main() {}

// storeHandle is what a store handle refers to.
type storeHandle struct {
	st *backend.Store
}

var (
	pluginsMu sync.Mutex
	// plugins are the plugin directories discovered, with the outcome.
	plugins = map[string]error{}

	countersMu sync.Mutex
	counters   []*instrument.Counter
)

// loadPlugins discovers the plugins of $CKPTKIT_PLUGIN_DIR (of the
// environment ctx carries) once per directory and process, so their
// schemes work in every URL.
func loadPlugins(ctx context.Context) error {
	dir := backend.Getenv(ctx, host.EnvPluginDir)
	if dir == "" {
		return nil
	}
	pluginsMu.Lock()
	defer pluginsMu.Unlock()
	err, done := plugins[dir]
	if !done {
		if _, derr := host.Discover(ctx, host.Config{Dir: dir}); derr != nil {
			err = fmt.Errorf("load plugins from %s: %w", dir, derr)
		}
		plugins[dir] = err
	}
	return err
}

// envIOCount, "1" in the environment of an open, wraps the store opened in
// an instrument.Counter kept for the life of the process, and
// ckpt_io_count reports what they saw (tests, diagnostics).
const envIOCount = "CKPTKIT_IO_COUNT"

// openStore opens url (with the I/O counter around its driver when the
// environment of ctx asks for it).
func openStore(ctx context.Context, url string) (*storeHandle, error) {
	if err := loadPlugins(ctx); err != nil {
		return nil, err
	}
	st, err := backend.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	if backend.Getenv(ctx, envIOCount) != "1" {
		return &storeHandle{st: st}, nil
	}
	cnt := instrument.Wrap(st.Driver())
	countersMu.Lock()
	counters = append(counters, cnt)
	countersMu.Unlock()
	return &storeHandle{st: st.WithDriver(cnt)}, nil
}

// errUsage marks bad arguments crossing the ABI.
var errUsage = ckpterr.New(ckpterr.Usage, "invalid argument")

// fail stores err in the out parameters and returns -1.
func fail(err error, cls *C.int, rule, msg **C.char) C.int {
	if cls != nil {
		*cls = C.int(ckpterr.ClassOf(err))
	}
	if rule != nil {
		*rule = nil
		if r := ruleOf(err); r != "" {
			*rule = C.CString(r)
		}
	}
	if msg != nil {
		*msg = C.CString(err.Error())
	}
	return -1
}

// cbytes views n bytes of C memory at p as a slice (no copy). The slice must
// not outlive the call.
func cbytes(p unsafe.Pointer, n C.int64_t) []byte {
	if n <= 0 || p == nil {
		return []byte{}
	}
	return unsafe.Slice((*byte)(p), int(n))
}

// cjson returns v as a C string of JSON.
func cjson(v any) (*C.char, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return C.CString(string(b)), nil
}

//export ckpt_abi_version
func ckpt_abi_version() C.int { return abiVersion }

//export ckpt_free
func ckpt_free(p unsafe.Pointer) { C.free(p) }

//export ckpt_crc32c
func ckpt_crc32c(crc C.uint32_t, buf unsafe.Pointer, n C.int64_t) C.uint32_t {
	return C.uint32_t(crc32c.Update(uint32(crc), cbytes(buf, n)))
}

// ckpt_open opens url with the environment variables env (a JSON object;
// NULL or "" for the process's own) under the cancellation token tok (0:
// none).
//
//export ckpt_open
func ckpt_open(tok C.uintptr_t, url, env *C.char, out *C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_open", cls, rule, msg, func() error {
		return withCall(tok, env, func(ctx context.Context) error {
			sh, err := openStore(ctx, C.GoString(url))
			if err != nil {
				return err
			}
			*out = C.uintptr_t(handles.add(sh))
			return nil
		})
	})
}

// ckpt_close releases a store handle, once the calls in flight on it have
// returned; new calls on it fail with a usage error at once.
//
//export ckpt_close
func ckpt_close(h C.uintptr_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_close", cls, rule, msg, func() error {
		sh, err := remove[*storeHandle](&handles, uint64(h), "store (close checkpoints with ckpt_checkpoint_close)")
		if err != nil {
			return err
		}
		return closeStore(sh)
	})
}

// ckpt_url sets *out to the redacted URL of key below the store (a C
// string freed with ckpt_free).
//
//export ckpt_url
func ckpt_url(h C.uintptr_t, key *C.char, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_url", cls, rule, msg, func() error {
		return withStore(h, func(sh *storeHandle) error { *out = C.CString(sh.st.URL(C.GoString(key))); return nil })
	})
}

// ckpt_capabilities returns the store's capabilities as JSON.
//
//export ckpt_capabilities
func ckpt_capabilities(h C.uintptr_t, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_capabilities", cls, rule, msg, func() error {
		return withStore(h, func(sh *storeHandle) error {
			return setJSON(out, capabilitiesOf(sh.st.Capabilities()))
		})
	})
}

// ckpt_put writes the concatenation of n C buffers (ptrs[i], lens[i]) as
// object key of exactly their total size. groups (n non-decreasing entries
// from 0, may be NULL for one group per buffer) gathers consecutive buffers
// into items; crcs (one entry per group, may be NULL) receives the CRC32C
// of each item, *total_crc the CRC32C of the whole body, which is also sent
// for server-side verification where the backend supports it. flags bit 0:
// create-if-absent (the write fails with class Conflict when key exists; on
// backends without atomic create-if-absent the call fails with class
// Unsupported).
//
//export ckpt_put
func ckpt_put(tok, h C.uintptr_t, key *C.char, ptrs *unsafe.Pointer, lens *C.int64_t, groups *C.int32_t, n C.int, flags C.int,
	crcs *C.uint32_t, totalCRC *C.uint32_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_put", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			bufs := make([][]byte, int(n))
			var size int64
			var total uint32
			if n > 0 {
				ps := unsafe.Slice(ptrs, int(n))
				ls := unsafe.Slice(lens, int(n))
				var gs []C.int32_t
				if groups != nil {
					gs = unsafe.Slice(groups, int(n))
				}
				group, crc := 0, uint32(0)
				for i := range bufs {
					if ls[i] < 0 {
						return fmt.Errorf("%w: buffer %d has length %d", errUsage, i, ls[i])
					}
					g := i
					if gs != nil {
						g = int(gs[i])
					}
					if g != group && g != group+1 || (i == 0 && g != 0) {
						return fmt.Errorf("%w: buffer %d is in group %d after group %d", errUsage, i, g, group)
					}
					if g != group {
						if crcs != nil {
							*(*C.uint32_t)(unsafe.Add(unsafe.Pointer(crcs), group*4)) = C.uint32_t(crc)
						}
						group, crc = g, 0
					}
					bufs[i] = cbytes(ps[i], ls[i])
					size += int64(ls[i])
					// One pass per buffer, cancellable (a buffer may hold
					// gigabytes): total continues from the checksums so far
					// (CRC32C composes only through the bytes).
					var err error
					if crc, err = crc32c.UpdateContext(ctx, crc, bufs[i]); err != nil {
						return fmt.Errorf("put %s: checksum of buffer %d: %w", sh.st.URL(C.GoString(key)), i, err)
					}
					if total, err = crc32c.UpdateContext(ctx, total, bufs[i]); err != nil {
						return fmt.Errorf("put %s: checksum of buffer %d: %w", sh.st.URL(C.GoString(key)), i, err)
					}
				}
				if crcs != nil {
					*(*C.uint32_t)(unsafe.Add(unsafe.Pointer(crcs), group*4)) = C.uint32_t(crc)
				}
			}
			if totalCRC != nil {
				*totalCRC = C.uint32_t(total)
			}
			opts := backend.PutOptions{IfNotExists: flags&1 != 0, CRC32C: &total}
			k := C.GoString(key)
			if opts.IfNotExists && !sh.st.Capabilities().CreateIfAbsent {
				return fmt.Errorf("put %s: create-if-absent: %w", sh.st.URL(k), backend.ErrUnsupported)
			}
			if err := sh.st.Put(ctx, k, size, backend.NewSlicesReader(bufs), opts); err != nil {
				return err
			}
			return nil
		})
	})
}

// ckpt_read reads exactly length bytes of key at offset into buf (C memory
// of at least length bytes). *crc receives their CRC32C. A short object
// fails naming key and offset.
//
//export ckpt_read
func ckpt_read(tok, h C.uintptr_t, key *C.char, offset, length C.int64_t, buf unsafe.Pointer, crc *C.uint32_t,
	cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_read", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			if offset < 0 || length < 0 {
				return fmt.Errorf("%w: offset %d, length %d", errUsage, offset, length)
			}
			dst := cbytes(buf, length)
			k := C.GoString(key)
			if err := sh.st.ReadRange(ctx, k, int64(offset), dst); err != nil {
				return fmt.Errorf("read %s at offset %d (%d bytes): %w", sh.st.URL(k), offset, length, err)
			}
			if crc != nil {
				sum, err := crc32c.UpdateContext(ctx, 0, dst)
				if err != nil {
					return fmt.Errorf("read %s at offset %d (%d bytes): checksum: %w", sh.st.URL(k), offset, length, err)
				}
				*crc = C.uint32_t(sum)
			}
			return nil
		})
	})
}

// segmentCRCs is a backend.Tap that computes one CRC32C per consecutive
// segment of a read as its pieces land (ReadRangeInto never hands it a piece
// that crosses a destination, and each segment is one destination).
type segmentCRCs struct {
	lens []int64
	crcs []uint32
	seg  int
	used int64
}

func (t *segmentCRCs) Write(p []byte) (int, error) {
	for len(t.lens) > 0 && t.seg < len(t.lens) && t.used == t.lens[t.seg] {
		t.seg, t.used = t.seg+1, 0
	}
	if t.seg >= len(t.lens) {
		return 0, fmt.Errorf("%w: read delivered more bytes than its segments hold", errUsage)
	}
	t.crcs[t.seg] = crc32c.Update(t.crcs[t.seg], p)
	t.used += int64(len(p))
	return len(p), nil
}

func (t *segmentCRCs) Reset() {
	clear(t.crcs)
	t.seg, t.used = 0, 0
}

// ckpt_read_segments reads the n consecutive segments of key that start at
// offset (lens[i] bytes each) into buf, back to back, as one ranged read, and
// stores each segment's CRC32C in crcs[i]. The CRCs are computed while each
// piece is still in cache, so checking the items of a coalesced read costs no
// second pass over memory.
//
//export ckpt_read_segments
func ckpt_read_segments(tok, h C.uintptr_t, key *C.char, offset C.int64_t, n C.int, lens *C.int64_t, buf unsafe.Pointer,
	crcs *C.uint32_t, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_read_segments", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			if offset < 0 || n < 0 || (n > 0 && (lens == nil || crcs == nil)) {
				return fmt.Errorf("%w: offset %d, %d segments", errUsage, offset, n)
			}
			segLens := unsafe.Slice((*int64)(unsafe.Pointer(lens)), int(n))
			dsts := make([][]byte, 0, n)
			var total int64
			for i, l := range segLens {
				if l < 0 {
					return fmt.Errorf("%w: segment %d has length %d", errUsage, i, l)
				}
				dsts = append(dsts, unsafe.Slice((*byte)(unsafe.Add(buf, total)), int(l)))
				total += l
			}
			tap := &segmentCRCs{lens: segLens, crcs: make([]uint32, n)}
			k := C.GoString(key)
			if err := sh.st.ReadRangeInto(ctx, k, int64(offset), dsts, tap); err != nil {
				return fmt.Errorf("read %s at offset %d (%d bytes): %w", sh.st.URL(k), offset, total, err)
			}
			copy(unsafe.Slice((*uint32)(unsafe.Pointer(crcs)), int(n)), tap.crcs)
			return nil
		})
	})
}

// ckpt_read_all reads object key from offset to its end (as one ranged
// read: the bytes before offset are not transferred; at most limit bytes,
// limit <= 0: no limit) into C memory *out of *n bytes, which the caller
// frees with ckpt_free.
//
//export ckpt_read_all
func ckpt_read_all(tok, h C.uintptr_t, key *C.char, offset, limit C.int64_t, out *unsafe.Pointer, n *C.int64_t,
	cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_read_all", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			if offset < 0 {
				return fmt.Errorf("%w: offset %d", errUsage, offset)
			}
			data, err := sh.st.ReadAllFrom(ctx, C.GoString(key), int64(offset), int64(limit))
			if err != nil {
				return err
			}
			*out = C.CBytes(data)
			*n = C.int64_t(len(data))
			return nil
		})
	})
}

// ckpt_stat returns key's size, modification time (Unix nanoseconds, 0 when
// unknown) and stored CRC32C (*has_crc 0 when the backend keeps none).
//
//export ckpt_stat
func ckpt_stat(tok, h C.uintptr_t, key *C.char, size, mtimeNs *C.int64_t, crc *C.uint32_t, hasCRC *C.int,
	cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_stat", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			a, err := sh.st.Stat(ctx, C.GoString(key))
			if err != nil {
				return err
			}
			*size = C.int64_t(a.Size)
			*mtimeNs = 0
			if !a.ModTime.IsZero() {
				*mtimeNs = C.int64_t(a.ModTime.UnixNano())
			}
			*hasCRC = 0
			if a.CRC32C != nil {
				*hasCRC = 1
				*crc = C.uint32_t(*a.CRC32C)
			}
			return nil
		})
	})
}

// ckpt_list returns the objects under prefix as a JSON array of
// {"key","size","mtime_ns"} in ascending key order (*out, freed with
// ckpt_free).
//
//export ckpt_list
func ckpt_list(tok, h C.uintptr_t, prefix *C.char, out **C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_list", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			list := []listEntry{}
			err := sh.st.List(ctx, C.GoString(prefix), func(o backend.ObjectInfo) error {
				e := listEntry{Key: o.Key, Size: o.Size}
				if !o.ModTime.IsZero() {
					e.MTimeNs = o.ModTime.UnixNano()
				}
				list = append(list, e)
				return nil
			})
			if err != nil {
				return err
			}
			return setJSON(out, list)
		})
	})
}

// ckpt_delete removes key (a missing key is not an error).
//
//export ckpt_delete
func ckpt_delete(tok, h C.uintptr_t, key *C.char, cls *C.int, rule, msg **C.char) C.int {
	return guard("ckpt_delete", cls, rule, msg, func() error {
		return storeCall(tok, h, func(ctx context.Context, sh *storeHandle) error {
			if err := sh.st.Delete(ctx, C.GoString(key)); err != nil {
				return err
			}
			return nil
		})
	})
}

// ckpt_io_count returns how many op calls ("read", "put", "stat", "list",
// "delete") on keys ending with suffix ("" for all) the stores opened
// through this library with CKPTKIT_IO_COUNT=1 in their environment have
// made, or -1 when no store was opened so (tests and diagnostics: "the
// metadata was read once"). The ops "bytes_read" and "bytes_written" (suffix
// "") count the bytes their reads delivered and their puts took.
//
//export ckpt_io_count
func ckpt_io_count(op, suffix *C.char) (out C.int64_t) {
	defer recoverQuiet("ckpt_io_count", func() { out = -1 })
	o, s := C.GoString(op), C.GoString(suffix)
	countersMu.Lock()
	defer countersMu.Unlock()
	if len(counters) == 0 {
		return -1
	}
	var n int64
	for _, c := range counters {
		switch {
		case o == "bytes_read":
			n += c.BytesRead()
		case o == "bytes_written":
			n += c.BytesWritten()
		case s == "":
			n += c.Count(o)
		default:
			n += c.CountKeySuffix(o, s)
		}
	}
	return C.int64_t(n)
}

// ckpt_goroutines returns the number of goroutines of the Go runtime (for
// leak tests: it must not grow with the number of calls).
//
//export ckpt_goroutines
func ckpt_goroutines() C.int64_t { return C.int64_t(runtime.NumGoroutine()) }

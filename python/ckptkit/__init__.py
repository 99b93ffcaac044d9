"""ckptkit for Python: checkpoint storage on every ckptkit URL through the Go
core (libckptkit, loaded with ctypes).

    import ckptkit
    st = ckptkit.Store("s3://bucket/run7?endpoint=http://127.0.0.1:7070")
    st.put("a", b"hello", if_absent=True)
    st.read("a", 1, 3)            # b"ell"

PyTorch support (``StorageWriter``, ``StorageReader``, ``save``, ``resume``)
is in :mod:`ckptkit.torch`. docs/TORCH.md documents both.
"""

import ctypes
import json
import threading

from . import _lib
from ._lib import CancelScope
from .errors import (  # noqa: F401 (re-exported)
    AccessError,
    BadCheckpointError,
    CanceledError,
    CheckpointError,
    ChecksumError,
    ConflictError,
    CoverageError,
    IncompleteError,
    LayoutMismatchError,
    MismatchError,
    MissingKeysError,
    NotFoundError,
    PartialStateError,
    TransientError,
    UnsupportedError,
    UsageError,
)

__all__ = [
    "Store",
    "CancelScope",
    "ObjectInfo",
    "RawBuffer",
    "abi_version",
    "crc32c",
    "io_count",
    "CheckpointError",
    "PartialStateError",
    "LayoutMismatchError",
    "CoverageError",
    "ChecksumError",
]


def abi_version():
    """The ABI version of the loaded libckptkit."""
    return _lib.lib().ckpt_abi_version()


class RawBuffer:
    """A buffer given by address and length, for memory ctypes cannot take
    the address of (read-only views torch hands out): the caller keeps the
    memory alive and unchanged for the duration of the call."""

    __slots__ = ("addr", "nbytes")

    def __init__(self, addr, nbytes):
        self.addr, self.nbytes = addr, nbytes


def _address(buf):
    """(address, length, keep-alive) of a buffer without copying: bytes,
    or any writable contiguous buffer (bytearray, memoryview, numpy array,
    BytesIO.getbuffer()). Other read-only buffers are copied once."""
    if isinstance(buf, RawBuffer):
        return (buf.addr if buf.nbytes else None), buf.nbytes, buf
    if isinstance(buf, bytes):
        if not buf:
            return None, 0, buf
        # c_char_p over a bytes object points at its internal buffer.
        return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value, len(buf), buf
    mv = memoryview(buf)
    if not mv.contiguous:
        raise UsageError("buffer is not contiguous")
    if mv.nbytes == 0:
        return None, 0, mv
    if mv.readonly:
        return _address(mv.tobytes())
    mv = mv.cast("B")
    return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes, mv


def _writable(buf: object, what: str) -> None:
    """Raise UsageError unless buf is a writable buffer (RawBuffer, or one
    whose memoryview is writable), before anything reads or copies it."""
    if isinstance(buf, RawBuffer):
        return
    try:
        ro = memoryview(buf).readonly
    except TypeError:
        raise UsageError(f"{what} needs a writable buffer, not {type(buf).__name__}") from None
    if ro:
        raise UsageError(f"{what} needs a writable buffer; {type(buf).__name__} is read-only")


def crc32c(data, crc=0):
    """The CRC32C (Castagnoli) of data, continuing from crc."""
    addr, n, keep = _address(data)
    r = _lib.lib().ckpt_crc32c(crc, addr, n)
    del keep
    return r


def io_count(op, suffix=""):
    """How many ``op`` calls ("read", "put", "stat", "list", "delete") on
    keys ending with suffix the stores opened in this process have made
    (diagnostics and tests: "the metadata was read once"); op
    "bytes_read" or "bytes_written" counts bytes instead (suffix ignored).
    Counting is on for the stores opened with CKPTKIT_IO_COUNT=1 in the
    environment; before the first such open, -1."""
    return _lib.lib().ckpt_io_count(op.encode(), suffix.encode())


def goroutines():
    """The Go runtime's goroutine count (leak tests)."""
    return _lib.lib().ckpt_goroutines()


def live_handles():
    """The number of handles of the Go core open (leak tests)."""
    return _lib.lib().ckpt_handles()


class ObjectInfo:
    """One listing entry: key (relative to the store), size, mtime_ns."""

    __slots__ = ("key", "size", "mtime_ns")

    def __init__(self, key, size, mtime_ns):
        self.key, self.size, self.mtime_ns = key, size, mtime_ns

    def __repr__(self):
        return f"ObjectInfo({self.key!r}, size={self.size})"


class Store(_lib.Closing):
    """A storage prefix opened by URL (file://, mem://, s3://, gs://, plugin
    schemes from $CKPTKIT_PLUGIN_DIR). Safe to use from several threads;
    every call releases the GIL while the Go core works. ``close()`` from one
    thread while others use the store waits for their calls in flight; later
    calls raise ``UsageError``. The environment variables the backend needs
    (credentials, endpoint, region, ...) are taken from ``os.environ`` when
    the store is opened. Every I/O method takes ``scope``, a
    :class:`CancelScope` whose ``cancel()`` stops it."""

    def __init__(self, url):
        self._h = 0
        self._borrowed = False
        self._close_lock = threading.Lock()
        self.url = url
        h = ctypes.c_size_t(0)
        _lib.call("ckpt_open", url.encode(), _lib.environment(), ctypes.byref(h))
        self._h = h.value

    @classmethod
    def _from_handle(cls, handle, url):
        st = cls.__new__(cls)
        st._h = handle
        st.url = url
        st._borrowed = True
        st._close_lock = threading.Lock()
        return st

    def _handle(self):
        # A handle read here may be closed by another thread before the
        # call reaches the Go core: the core's handle table then refuses
        # it with a UsageError, it never reaches a released store.
        h = self._h
        if not h:
            raise UsageError(f"store {self.url} is closed")
        return h

    def close(self):
        """Release the store (idempotent, thread-safe); waits for the calls
        in flight on it."""
        with self._close_lock:
            h, self._h = self._h, 0
        if h and not self._borrowed:
            _lib.call("ckpt_close", h)

    def object_url(self, key=""):
        """The redacted URL of key below the store."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_url", self._handle(), key.encode(), ctypes.byref(out))
        return _lib.take_string(out.value)

    def capabilities(self):
        """The backend's capabilities (create_if_absent, server_crc32c, ...)."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_capabilities", self._handle(), ctypes.byref(out))
        return json.loads(_lib.take_string(out))

    def put(self, key, data, *, if_absent=False, groups=None, scope=None):
        """Write data (one buffer or a list of buffers, concatenated) as key,
        of exactly their total size, with its CRC32C (checked by the server
        where the backend supports it). With if_absent the write fails with
        ConflictError when key exists (UnsupportedError where the backend
        has no atomic create-if-absent). groups, one non-decreasing number
        per buffer from 0, gathers consecutive buffers into items (default:
        one item per buffer). Returns (total_crc, [crc per item])."""
        bufs = data if isinstance(data, (list, tuple)) else [data]
        n = len(bufs)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        lens = (ctypes.c_int64 * max(n, 1))()
        ngroups = (groups[-1] + 1) if groups else n
        crcs = (ctypes.c_uint32 * max(ngroups, 1))()
        garr = (ctypes.c_int32 * max(n, 1))(*groups) if groups else None
        keep = []
        for i, b in enumerate(bufs):
            addr, ln, k = _address(b)
            ptrs[i] = addr
            lens[i] = ln
            keep.append(k)
        total = ctypes.c_uint32(0)
        _lib.call(
            "ckpt_put",
            self._handle(),
            key.encode(),
            ptrs,
            lens,
            garr,
            n,
            1 if if_absent else 0,
            crcs,
            ctypes.byref(total),
            scope=scope,
        )
        del keep
        return total.value, list(crcs[:ngroups])

    def read_into(self, key, offset, buf, *, scope=None):
        """Read exactly len(buf) bytes of key at offset into the writable
        buffer buf (no copy through Python); returns their CRC32C. A
        read-only buffer is refused before anything is copied or read."""
        _writable(buf, "read_into")
        addr, n, keep = _address(buf)
        crc = ctypes.c_uint32(0)
        _lib.call("ckpt_read", self._handle(), key.encode(), offset, n, addr, ctypes.byref(crc), scope=scope)
        del keep
        return crc.value

    def read_segments(self, key, offset, buf, lengths, *, scope=None):
        """Read consecutive segments of key, starting at offset, of the
        given lengths into the writable buffer buf (back to back, as one
        ranged read; len(buf) must be their sum) and return each segment's
        CRC32C, computed by the Go core as the bytes land (no second pass)."""
        _writable(buf, "read_segments")
        addr, n, keep = _address(buf)
        if sum(lengths) != n:
            raise UsageError(f"read_segments: segments hold {sum(lengths)} bytes, the buffer {n}")
        k = len(lengths)
        lens = (ctypes.c_int64 * k)(*lengths)
        crcs = (ctypes.c_uint32 * k)()
        _lib.call("ckpt_read_segments", self._handle(), key.encode(), offset, k, lens, addr, crcs, scope=scope)
        del keep
        return list(crcs)

    def read(self, key, offset=0, length=None, *, scope=None):
        """Read length bytes of key at offset (when length is None, from
        offset to the end: one ranged read, the bytes before offset are not
        transferred; b"" from an offset at or past the end)."""
        if length is None:
            if offset < 0:
                raise UsageError(f"read {key!r}: negative offset {offset}")
            out = ctypes.c_void_p()
            n = ctypes.c_int64(0)
            _lib.call("ckpt_read_all", self._handle(), key.encode(), offset, 0, ctypes.byref(out), ctypes.byref(n),
                      scope=scope)
            return _lib.take_bytes(out.value, n.value)
        buf = bytearray(length)
        self.read_into(key, offset, buf, scope=scope)
        return bytes(buf)

    def stat(self, key, *, scope=None):
        """(size, mtime_ns, crc32c or None) of key; NotFoundError when absent."""
        size, mt, crc, has = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_uint32(), ctypes.c_int()
        _lib.call(
            "ckpt_stat",
            self._handle(),
            key.encode(),
            ctypes.byref(size),
            ctypes.byref(mt),
            ctypes.byref(crc),
            ctypes.byref(has),
            scope=scope,
        )
        return size.value, mt.value, (crc.value if has.value else None)

    def exists(self, key):
        """Whether key exists."""
        try:
            self.stat(key)
            return True
        except NotFoundError:
            return False

    def list(self, prefix="", *, scope=None):
        """The objects under prefix, in ascending key order."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_list", self._handle(), prefix.encode(), ctypes.byref(out), scope=scope)
        return [ObjectInfo(e["key"], e["size"], e["mtime_ns"]) for e in json.loads(_lib.take_string(out))]

    def delete(self, key, *, scope=None):
        """Remove key; a missing key is not an error."""
        _lib.call("ckpt_delete", self._handle(), key.encode(), scope=scope)

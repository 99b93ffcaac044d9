"""The ctypes binding of libckptkit (the Go core built with -buildmode=c-shared).

Every call goes through ``ctypes.CDLL``, which releases the GIL for the
duration of a foreign call, so uploads and downloads overlap with Python work
in other threads. The library is looked up next to this file (where
``make python`` puts it) unless ``CKPTKIT_LIB`` names another path.
"""

import ctypes
import os
import threading

from . import errors

#: The ABI version this binding speaks; a library of another version is refused.
ABI_VERSION = 1

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_u32_p = ctypes.POINTER(ctypes.c_uint32)
_i64_p = ctypes.POINTER(ctypes.c_int64)
_uptr_p = ctypes.POINTER(ctypes.c_size_t)
_void_pp = ctypes.POINTER(ctypes.c_void_p)

_ERR = [_c_int_p, _c_char_pp, _c_char_pp]

_SIGNATURES = {
    "ckpt_abi_version": ([], ctypes.c_int),
    "ckpt_free": ([ctypes.c_void_p], None),
    "ckpt_crc32c": ([ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64], ctypes.c_uint32),
    "ckpt_open": ([ctypes.c_char_p, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_close": ([ctypes.c_size_t] + _ERR, ctypes.c_int),
    "ckpt_url": ([ctypes.c_size_t, ctypes.c_char_p], ctypes.c_void_p),
    "ckpt_capabilities": ([ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_put": (
        [ctypes.c_size_t, ctypes.c_char_p, _void_pp, _i64_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int, ctypes.c_int,
         _u32_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read": (
        [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read_segments": (
        [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, _i64_p, ctypes.c_void_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read_all": ([ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int64, _void_pp, _i64_p] + _ERR, ctypes.c_int),
    "ckpt_stat": ([ctypes.c_size_t, ctypes.c_char_p, _i64_p, _i64_p, _u32_p, _c_int_p] + _ERR, ctypes.c_int),
    "ckpt_list": ([ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_delete": ([ctypes.c_size_t, ctypes.c_char_p] + _ERR, ctypes.c_int),
    "ckpt_io_count": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int64),
    "ckpt_goroutines": ([], ctypes.c_int64),
    "ckpt_checkpoint_open": ([ctypes.c_char_p, _uptr_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_metadata": ([ctypes.c_size_t, _void_pp, _i64_p] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_close": ([ctypes.c_size_t] + _ERR, ctypes.c_int),
    "ckpt_saver_new": ([ctypes.c_int64, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_saver_default_staging_bytes": ([], ctypes.c_int64),
    "ckpt_saver_save": (
        [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p, _void_pp, ctypes.c_int, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_save_state": ([ctypes.c_size_t], ctypes.c_int),
    "ckpt_save_wait": ([ctypes.c_size_t, ctypes.c_int64, _c_int_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_save_release": ([ctypes.c_size_t], None),
    "ckpt_saver_stats": ([ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_saver_idle": ([ctypes.c_size_t, ctypes.c_int] + _ERR, ctypes.c_int),
    "ckpt_run_layout": ([ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_load": ([ctypes.c_size_t, ctypes.c_char_p, _void_pp, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
}

_lib = None
_lock = threading.Lock()


def lib_path():
    """Where the shared library is loaded from."""
    return os.environ.get("CKPTKIT_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libckptkit.so")


def lib():
    """The loaded library (loaded and version-checked on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = lib_path()
            if not os.path.exists(path):
                raise errors.CheckpointError(
                    f"libckptkit not found at {path}: run `make python` in the ckptkit repository", cls=errors.USAGE
                )
            dll = ctypes.CDLL(path)
            for name, (args, res) in _SIGNATURES.items():
                fn = getattr(dll, name)
                fn.argtypes = args
                fn.restype = res
            got = dll.ckpt_abi_version()
            if got != ABI_VERSION:
                raise errors.CheckpointError(
                    f"libckptkit at {path} has ABI version {got}, this binding needs {ABI_VERSION}: rebuild with `make python`",
                    cls=errors.UNSUPPORTED,
                )
            _lib = dll
    return _lib


def take_string(ptr):
    """Copy a C string returned by the library and free it."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().ckpt_free(ptr)


def take_bytes(ptr, n):
    """Copy n bytes of C memory returned by the library and free it."""
    if not ptr:
        return b""
    try:
        return ctypes.string_at(ptr, n)
    finally:
        lib().ckpt_free(ptr)


def call(name, *args):
    """Call a library function that takes the error out-parameters last;
    raise the matching ckptkit error when it fails."""
    cls = ctypes.c_int(0)
    rule = ctypes.c_char_p()
    msg = ctypes.c_char_p()
    fn = getattr(lib(), name)
    rc = fn(*args, ctypes.byref(cls), ctypes.byref(rule), ctypes.byref(msg))
    if rc != 0:
        # The strings were allocated by C.CString: copy, then free them.
        r = _take(rule)
        m = _take(msg)
        raise errors.from_abi(cls.value, r, m)


def _take(p):
    if not p.value:
        return ""
    s = p.value.decode("utf-8", "replace")
    lib().ckpt_free(ctypes.cast(p, ctypes.c_void_p))
    return s


class Closing:
    """Context-manager and finaliser plumbing for objects holding a library
    handle: subclasses define close() (idempotent)."""

    def close(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

"""The ctypes binding of libckptkit (the Go core built with -buildmode=c-shared).

Every call goes through ``ctypes.CDLL``, which releases the GIL for the
duration of a foreign call, so uploads and downloads overlap with Python work
in other threads. The library is looked up next to this file (where
``make python`` puts it) unless ``CKPTKIT_LIB`` names another path.

Three rules of the binding (docs/TORCH.md, "The C ABI"):

- Cancellation: every long call takes a cancellation token. Made from the
  main thread, the call runs in a helper thread while the main thread waits,
  so Ctrl-C (``KeyboardInterrupt``) or an exception raised by a signal
  handler (a SIGTERM handler raising ``CanceledError``) is delivered at once:
  the token is cancelled, the Go work stops (within a second), and the
  exception propagates. Calls from other threads take the token of the
  :class:`CancelScope` they run in, if any. The main thread never blocks
  without a timeout while Go work runs: it waits in slices of
  :data:`POLL_SECONDS` (:func:`wait_future`, :func:`queue_get`), since a
  signal the kernel delivers to another thread (a Go thread, a helper) does
  not interrupt an untimed lock wait, and the handler would run only once
  the call returned.
- Fork: the Go runtime does not survive ``fork()``; a child forked after the
  library was loaded gets a ``UsageError`` from every call, never a hang.
- Environment: every open passes the variables of :data:`ENV_PREFIXES` from
  ``os.environ`` as they are at that moment (the Go runtime keeps the copy
  it took when the library was loaded).
"""

import concurrent.futures
import ctypes
import json
import os
import queue
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from . import errors

#: What the C calls take: integers, ctypes values, pointers and arrays.
CArg = Any

#: The ABI version this binding speaks; a library of another version is refused.
ABI_VERSION = 3

#: The environment variables passed to every open: credentials, endpoints,
#: regions, profiles, emulator hosts and ckptkit's own.
ENV_PREFIXES = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_", "CKPTKIT_")
ENV_NAMES = ("STORAGE_EMULATOR_HOST", "HOME")

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_u32_p = ctypes.POINTER(ctypes.c_uint32)
_i64_p = ctypes.POINTER(ctypes.c_int64)
_uptr_p = ctypes.POINTER(ctypes.c_size_t)
_void_pp = ctypes.POINTER(ctypes.c_void_p)

_ERR = [_c_int_p, _c_char_pp, _c_char_pp]
_tok = ctypes.c_size_t
_h = ctypes.c_size_t

_SIGNATURES: Dict[str, Tuple[List[Any], Any]] = {
    "ckpt_abi_version": ([], ctypes.c_int),
    "ckpt_free": ([ctypes.c_void_p], None),
    "ckpt_crc32c": ([ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64], ctypes.c_uint32),
    "ckpt_cancel_new": ([], ctypes.c_size_t),
    "ckpt_cancel": ([_tok], ctypes.c_int),
    "ckpt_cancel_free": ([_tok], ctypes.c_int),
    "ckpt_handles": ([], ctypes.c_int64),
    "ckpt_open": ([_tok, ctypes.c_char_p, ctypes.c_char_p, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_close": ([_h] + _ERR, ctypes.c_int),
    "ckpt_url": ([_h, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_capabilities": ([_h, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_put": (
        [_tok, _h, ctypes.c_char_p, _void_pp, _i64_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int, ctypes.c_int,
         _u32_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read": (
        [_tok, _h, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read_segments": (
        [_tok, _h, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, _i64_p, ctypes.c_void_p, _u32_p] + _ERR,
        ctypes.c_int,
    ),
    "ckpt_read_all": ([_tok, _h, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, _void_pp, _i64_p] + _ERR,
                      ctypes.c_int),
    "ckpt_stat": ([_tok, _h, ctypes.c_char_p, _i64_p, _i64_p, _u32_p, _c_int_p] + _ERR, ctypes.c_int),
    "ckpt_list": ([_tok, _h, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_delete": ([_tok, _h, ctypes.c_char_p] + _ERR, ctypes.c_int),
    "ckpt_io_count": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int64),
    "ckpt_goroutines": ([], ctypes.c_int64),
    "ckpt_checkpoint_open": ([_tok, ctypes.c_char_p, ctypes.c_char_p, _uptr_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR,
                             ctypes.c_int),
    "ckpt_checkpoint_metadata": ([_h, _void_pp, _i64_p] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_close": ([_h] + _ERR, ctypes.c_int),
    "ckpt_saver_new": ([ctypes.c_int64, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_saver_open": ([ctypes.c_char_p, _uptr_p] + _ERR, ctypes.c_int),
    "ckpt_saver_default_staging_bytes": ([], ctypes.c_int64),
    "ckpt_saver_save": (
        [_tok, _h, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _void_pp, ctypes.c_int, _uptr_p] + _ERR,
        ctypes.c_int),
    "ckpt_save_state": ([_h, _c_int_p] + _ERR, ctypes.c_int),
    "ckpt_save_wait": ([_tok, _h, ctypes.c_int64, _c_int_p, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_save_wait_staged": ([_tok, _h, ctypes.c_int64, _c_int_p] + _ERR, ctypes.c_int),
    "ckpt_save_release": ([_h] + _ERR, ctypes.c_int),
    "ckpt_saver_cancel": ([_h] + _ERR, ctypes.c_int),
    "ckpt_saver_stats": ([_h, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_saver_idle": ([_tok, _h, ctypes.c_int] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_load": ([_tok, _h, ctypes.c_char_p, _void_pp, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)] + _ERR,
                             ctypes.c_int),
    "ckpt_run_layout": ([ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_run_resume": ([_tok, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_checkpoint_fail": ([_h, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p] + _ERR, ctypes.c_int),
    "ckpt_tiered_open": ([_tok, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _uptr_p] + _ERR,
                         ctypes.c_int),
    "ckpt_tiered_committed": ([_tok, _h, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_tiered_wait": ([_tok, _h, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)] + _ERR, ctypes.c_int),
    "ckpt_tiered_close": ([_h, ctypes.c_int64] + _ERR, ctypes.c_int),
    "ckpt_read_items": ([_tok, _h, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64),
                         ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_int, ctypes.POINTER(ctypes.c_int)] + _ERR, ctypes.c_int),
}

#: The calls that take a cancellation token first (call() passes it).
CANCELLABLE = frozenset({
    "ckpt_open", "ckpt_put", "ckpt_read", "ckpt_read_segments", "ckpt_read_all", "ckpt_stat", "ckpt_list",
    "ckpt_delete", "ckpt_checkpoint_open", "ckpt_checkpoint_load", "ckpt_saver_save", "ckpt_save_wait", "ckpt_read_items",
    "ckpt_save_wait_staged",
    "ckpt_saver_idle", "ckpt_run_resume", "ckpt_tiered_open", "ckpt_tiered_committed", "ckpt_tiered_wait"})

#: The load callback of ckpt_run_resume: (checkpoint handle, JSON info) ->
#: 0 on success, non-zero on failure.
LOAD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p)

_lib: Optional[ctypes.CDLL] = None
_lock = threading.Lock()


def lib_path() -> str:
    """Where the shared library is loaded from."""
    return os.environ.get("CKPTKIT_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libckptkit.so")


_forked = False


def _after_fork_in_child() -> None:
    global _forked
    if _lib is not None:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """True in a child forked after the library was loaded (where no call
    may reach it)."""
    return _forked


def _refuse_forked() -> None:
    raise errors.UsageError(
        f"ckptkit cannot be used in a process forked (pid {os.getpid()}) from one that had loaded it: the Go runtime "
        "does not survive fork(). Start workers with the 'spawn' or 'forkserver' start method "
        "(multiprocessing.set_start_method, DataLoader(multiprocessing_context='spawn')), or use ckptkit only "
        "in the parent")


def lib() -> ctypes.CDLL:
    """The loaded library (loaded and version-checked on first use)."""
    global _lib
    if _forked:
        _refuse_forked()
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


def environment() -> bytes:
    """The variables every open passes to the Go core (JSON bytes): those
    of os.environ named by ENV_PREFIXES and ENV_NAMES, as they are now."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return json.dumps(env).encode()


class CancelScope:
    """A cancellation token of the Go core for a group of calls, which may run
    in other threads (pass ``scope`` to them): ``cancel()`` stops them all
    promptly (they raise ``CanceledError``). As a context manager it cancels
    on any exception leaving the block (Ctrl-C included) and is released at
    the end. Safe to cancel from any thread or a signal handler."""

    def __init__(self) -> None:
        self._h: int = lib().ckpt_cancel_new()
        if not self._h:
            raise errors.CheckpointError("could not make a cancellation token")
        self._hlock = threading.Lock()
        self.cancelled = False

    def handle(self) -> int:
        """The token (0 once released)."""
        return self._h

    def cancel(self) -> None:
        """Cancel the calls made with this scope (idempotent)."""
        self.cancelled = True
        with self._hlock:
            if self._h and not _forked:
                lib().ckpt_cancel(self._h)

    def close(self) -> None:
        """Release the token once the calls made with it have returned (the
        Go side waits for them; outside the lock, so that cancel() from
        another thread or a signal handler can still stop them)."""
        with self._hlock:
            h, self._h = self._h, 0
        if h and not _forked:
            lib().ckpt_cancel_free(h)

    def __enter__(self) -> "CancelScope":
        return self

    def __exit__(self, typ: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if typ is not None:
            self.cancel()
        self.close()


_calls: Optional[concurrent.futures.ThreadPoolExecutor] = None
_calls_lock = threading.Lock()


def _helper() -> concurrent.futures.ThreadPoolExecutor:
    """The helper threads that run the calls made from the main thread."""
    global _calls
    with _calls_lock:
        if _calls is None:
            _calls = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ckptkit-call")
        return _calls


#: The longest the main thread blocks at a time while it waits for Go work
#: (then it returns to the interpreter, which runs the signal handlers that
#: are due: Ctrl-C is raised within this of its delivery to any thread).
POLL_SECONDS: float = 0.05

_T = TypeVar("_T")


def wait_future(fut: "concurrent.futures.Future[_T]", timeout: Optional[float] = None) -> _T:
    """fut's result, waited for in slices of POLL_SECONDS (so that Ctrl-C
    or a signal handler's exception interrupts the wait promptly, whichever
    thread the signal was delivered to); concurrent.futures.TimeoutError
    after timeout seconds (None: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not fut.done():
        left = POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - time.monotonic())
        if left <= 0:
            raise concurrent.futures.TimeoutError()
        concurrent.futures.wait((fut,), timeout=left)
    return fut.result()


def queue_get(q: "queue.Queue[_T]") -> _T:
    """The next item of queue q, waited for in slices of POLL_SECONDS (as
    wait_future)."""
    while True:
        try:
            return q.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue


def wait_out(fut: "concurrent.futures.Future[Any]") -> None:
    """Wait for fut to end, whatever arrives meanwhile (the Go call still
    uses the caller's buffers until it returns; once cancelled it does so
    promptly)."""
    while not fut.done():
        try:
            concurrent.futures.wait((fut,), timeout=POLL_SECONDS)
        except BaseException:  # a second Ctrl-C: keep waiting, briefly
            pass


def cancel_all(futures: Sequence["concurrent.futures.Future[Any]"], scope: Optional["CancelScope"] = None) -> None:
    """Cancel scope (the Go calls the futures make) and the futures not
    started yet, then wait for the others to end (promptly, cancelled)."""
    if scope is not None:
        scope.cancel()
    for f in futures:
        f.cancel()
    for f in futures:
        wait_out(f)


def wait_all(futures: Sequence["concurrent.futures.Future[_T]"], scope: Optional["CancelScope"] = None) -> list[_T]:
    """The results of futures, waited for in slices (as wait_future). When
    one fails or the wait is interrupted (Ctrl-C), the others are cancelled
    (cancel_all) before that exception is raised."""
    try:
        return [wait_future(f) for f in futures]
    except BaseException:
        cancel_all(futures, scope)
        raise


def _invoke(fn: Callable[..., int], args: Tuple[CArg, ...]) -> None:
    cls = ctypes.c_int(0)
    rule = ctypes.c_char_p()
    msg = ctypes.c_char_p()
    rc = fn(*args, ctypes.byref(cls), ctypes.byref(rule), ctypes.byref(msg))
    if rc != 0:
        # The strings were allocated by C.CString: copy, then free them.
        r = _take(rule)
        m = _take(msg)
        raise errors.from_abi(cls.value, r, m)


def call(name: str, *args: CArg, scope: Optional[CancelScope] = None) -> None:
    """Call a library function that takes the error out-parameters last;
    raise the matching ckptkit error when it fails. A call of CANCELLABLE
    gets its token first: the scope's, else (from the main thread) one of
    its own, cancelled when an exception (KeyboardInterrupt) interrupts the
    wait."""
    fn = getattr(lib(), name)
    if name not in CANCELLABLE:
        _invoke(fn, args)
        return
    if threading.current_thread() is not threading.main_thread():
        _invoke(fn, (scope.handle() if scope is not None else 0,) + args)
        return
    own = scope is None
    sc = scope if scope is not None else CancelScope()
    try:
        try:
            fut = _helper().submit(_invoke, fn, (sc.handle(),) + args)
        except RuntimeError:
            # The interpreter is exiting (no new helper threads): call
            # directly.
            _invoke(fn, (sc.handle(),) + args)
            return
        try:
            wait_future(fut)
        except BaseException:
            if not fut.done():
                # Interrupted while the Go call runs: stop it, wait for it
                # to return, and raise what interrupted (not its
                # CanceledError).
                sc.cancel()
                wait_out(fut)
                raise
            raise
    finally:
        if own:
            sc.close()


def take_string(ptr: Optional[int]) -> str:
    """Copy a C string returned by the library and free it."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().ckpt_free(ptr)


def take_bytes(ptr: Optional[int], n: int) -> bytes:
    """Copy n bytes of C memory returned by the library and free it."""
    if not ptr:
        return b""
    try:
        return ctypes.string_at(ptr, n)
    finally:
        lib().ckpt_free(ptr)


def _take(p: ctypes.c_char_p) -> str:
    if not p.value:
        return ""
    s = p.value.decode("utf-8", "replace")
    lib().ckpt_free(ctypes.cast(p, ctypes.c_void_p))
    return s


_C = TypeVar("_C", bound="Closing")


class Closing:
    """Context-manager and finaliser plumbing for objects holding a library
    handle: subclasses define close() (idempotent)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

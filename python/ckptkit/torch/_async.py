"""Asynchronous saves through the Go core's saver (saver.Saver, driven by the
C ABI's ckpt_saver_* calls): the state is staged into the saver's pool,
bounded by its staging budget, the call returns, and the data objects are
written in the background with the metadata committed last. Nothing is
staged in Python: the Go saver copies straight out of the tensors' memory
before ckpt_saver_save returns.
"""

import atexit
import ctypes
import io
import json
import logging
import os
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ckptkit import _lib, errors
from ckptkit._wire import SaveResult, SaverStats
from ckptkit.errors import CheckpointError, UsageError

log = logging.getLogger("ckptkit")

#: The states of an asynchronous save, as ckpt_save_state numbers them.
STATES = ("staging", "staged", "committed", "failed")


def default_staging_bytes() -> int:
    """The Go saver's default staging budget (saver.DefaultStagingBytes)."""
    return int(_lib.lib().ckpt_saver_default_staging_bytes())


class AsyncSaver(_lib.Closing):
    """One saver.Saver of the Go core: its staging pool (at most
    ``staging_bytes`` held at any moment, reused from save to save), at most
    one save in flight, and the rule that a background failure is reported
    by the next save as well as by ``AsyncSave.wait``. Thread-safe."""

    def __init__(self, staging_bytes: Optional[int] = None) -> None:
        self._h = 0
        self._close_lock = threading.Lock()
        self._last: Optional[AsyncSave] = None  # the newest AsyncSave
        self.staging_bytes = default_staging_bytes() if staging_bytes is None else int(staging_bytes)
        h = ctypes.c_size_t(0)
        _lib.call("ckpt_saver_new", self.staging_bytes, ctypes.byref(h))
        self._h = h.value

    def _handle(self) -> int:
        h = self._h
        if not h:
            raise UsageError("the saver is closed")
        return h

    def save(self, url: str, spec: Mapping[str, Any],
             tensors: Sequence[Tuple[Mapping[str, Any], torch.Tensor]]) -> "AsyncSave":
        """Start the save of one rank's state to the checkpoint url: spec is
        the C ABI's save spec (capi/saver.go saveSpec) without the
        tensors, tensors a list of (spec entry, contiguous CPU tensor).
        Returns an AsyncSave once the state is staged. Ctrl-C while it
        stages aborts it (nothing is committed)."""
        entries: List[Dict[str, Any]] = []
        ptrs: List[Optional[int]] = []
        for entry, t in tensors:
            nbytes = t.numel() * t.element_size()
            entry = dict(entry, nbytes=nbytes, buf=len(ptrs))
            ptrs.append(t.data_ptr() if nbytes else None)
            entries.append(entry)
        spec = dict(spec, tensors=entries)
        arr = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        out = ctypes.c_size_t(0)
        # tensors stays referenced for the whole call: the Go saver reads
        # their memory until the state is staged, and never after.
        _lib.call("ckpt_saver_save", self._handle(), url.encode(), _lib.environment(), json.dumps(spec).encode(), arr,
                  len(ptrs), ctypes.byref(out))
        self._last = AsyncSave(out.value, url)
        return self._last

    def stats(self) -> SaverStats:
        """The staging figures: budget_bytes, pool_bytes (allocated),
        held_bytes (now), peak_bytes (since the saver was created)."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_saver_stats", self._handle(), ctypes.byref(out))
        return SaverStats.from_json(_lib.take_string(out.value))

    def idle(self) -> None:
        """Wait for the save in flight; raise its error if it failed and no
        save reported it yet."""
        _lib.call("ckpt_saver_idle", self._handle(), 0)

    def cancel(self) -> None:
        """Abort the save in flight, if any: it fails with CanceledError and
        commits nothing."""
        h = self._h
        if h:
            _lib.call("ckpt_saver_cancel", h)

    def close(self) -> None:
        """Wait for the save in flight and release the saver (idempotent);
        raises the save's error like idle()."""
        with self._close_lock:
            h, self._h = self._h, 0
        if h:
            _lib.call("ckpt_saver_idle", h, 1)


class AsyncSave:
    """An asynchronous save returned by ``ckptkit.torch.save(...,
    async_save=True)``: staged when you get it (the tensors may change), then
    written in the background and committed last. Thread-safe.

    ``wait(timeout=None)`` returns the checkpoint URL once committed, or
    raises the save's error (the ckptkit exception of its class);
    ``done()`` tells whether it has ended; ``status`` is "staged",
    "committed" or "failed"; ``result`` (after wait) is the Go saver's
    figures, a :class:`~ckptkit.torch.SaveResult`: bytes_written, seconds
    (start to commit), stall_seconds (how long save() blocked: waiting for
    the previous save, planning, staging), ...
    """

    def __init__(self, handle: int, url: str) -> None:
        self._h = handle
        self.url = url
        self.result: Optional[SaveResult] = None
        self._error: Optional[CheckpointError] = None
        self._lock = threading.Lock()  # one wait() at a time
        # Guards the Go handle: status() may run while wait() blocks, and
        # must never query a handle wait() or __del__ released.
        self._hlock = threading.Lock()
        self._released = False

    def _release(self) -> None:
        with self._hlock:
            if not self._released:
                self._released = True
                _lib.call("ckpt_save_release", self._h)

    def __del__(self) -> None:
        # A save never waited for still ends (and the next save reports a
        # failure); only the handle is let go.
        try:
            self._release()
        except Exception:
            pass

    @property
    def status(self) -> str:
        """"staging", "staged", "committed" or "failed"."""
        if self.result is not None:
            return "committed"
        if self._error is not None:
            return "failed"
        with self._hlock:
            if self._released:  # wait() is just recording the outcome
                return "committed" if self._error is None else "failed"
            st = ctypes.c_int(-1)
            _lib.call("ckpt_save_state", self._h, ctypes.byref(st))
        return STATES[st.value] if 0 <= st.value < len(STATES) else "failed"

    def done(self) -> bool:
        """True once the save has committed or failed."""
        return self.status in ("committed", "failed")

    def wait(self, timeout: Optional[float] = None) -> str:
        """Wait for the commit (at most timeout seconds: TimeoutError after
        that, the save goes on) and return the checkpoint URL; raise the
        save's error if it failed. Waiting does not consume the error: the
        next save raises it too. Ctrl-C interrupts the wait (the save goes
        on, unless the interpreter then exits: see docs/TORCH.md)."""
        with self._lock:
            if self.result is None and self._error is None:
                ms = -1 if timeout is None else max(0, int(timeout * 1000))
                done = ctypes.c_int(0)
                out = ctypes.c_void_p()
                try:
                    _lib.call("ckpt_save_wait", self._h, ms, ctypes.byref(done), ctypes.byref(out))
                except CheckpointError as e:  # the save's own error
                    if not done.value:
                        raise  # the wait itself failed (cancelled)
                    self._error = e
                else:
                    if not done.value:
                        raise TimeoutError(f"the save to {self.url} has not ended after {timeout} s")
                    self.result = SaveResult.from_json(_lib.take_string(out.value))
                if self.result is not None or self._error is not None:
                    self._release()
            if self._error is not None:
                raise self._error
            return self.url

    def __repr__(self) -> str:
        return f"<AsyncSave {self.url} {self.status}>"


_saver: Optional[AsyncSaver] = None
_saver_lock = threading.Lock()


def saver_for(staging_bytes: Optional[int]) -> AsyncSaver:
    """The process's saver, with the staging budget asked for (None: the Go
    default). A different budget replaces it once its save in flight has
    ended (raising that save's failure if no save reported it yet)."""
    global _saver
    budget = default_staging_bytes() if staging_bytes is None else int(staging_bytes)
    with _saver_lock:
        if _saver is not None and budget != _saver.staging_bytes:
            old, _saver = _saver, None
            old.close()
        if _saver is None:
            _saver = AsyncSaver(budget)
        return _saver


def current_saver() -> Optional[AsyncSaver]:
    """The process's saver, or None before the first asynchronous save."""
    return _saver


def close() -> None:
    """Wait for the asynchronous save in flight, if any, and release the
    process's saver; raise the save's error if it failed and no call
    reported it yet. A job calls it after its last save, before it reports
    success."""
    global _saver
    with _saver_lock:
        s, _saver = _saver, None
    if s is not None:
        s.close()


#: The exit code of a job whose last asynchronous save failed at exit while
#: it would otherwise have exited 0: the exit code of the error's class (as
#: the ckpt CLI's, README "Exit codes").
EXIT_CODES: Dict[int, int] = {errors.BAD_CHECKPOINT: 1, errors.USAGE: 2, errors.NOT_FOUND: 3, errors.ACCESS: 4, errors.TRANSIENT: 5,
              errors.CONFLICT: 6, errors.UNSUPPORTED: 7, errors.CANCELED: 130}


def _interrupted() -> Optional[BaseException]:
    """The exception the interpreter is exiting with, when it is Ctrl-C or
    a cancellation (uncaught: the interpreter printed it), else None."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc if isinstance(exc, (KeyboardInterrupt, errors.CanceledError)) else None


def _at_exit() -> None:
    # A job that ends right after an asynchronous save still commits it;
    # one interrupted by Ctrl-C (or a cancellation) aborts it instead, so
    # the interrupt stops the work promptly and nothing is committed. A
    # failed last save is never silent: it is logged, and a job that would
    # have exited 0 exits with the error's code.
    global _saver
    s = _saver
    if s is None or _lib.forked():
        return
    _saver = None
    interrupted = _interrupted()
    if interrupted is not None:
        try:
            s.cancel()
        except Exception:
            pass
    try:
        s.close()
    except BaseException as e:
        if interrupted is not None and isinstance(e, errors.CanceledError):
            log.warning("ckptkit: the asynchronous save in flight was aborted by %s; nothing was committed",
                        type(interrupted).__name__)
            return
        log.error("ckptkit: the last asynchronous save failed at exit, nothing of it was committed: %s", e)
        last = s._last
        seen = last is not None and last._error is not None  # the job saw it in wait() and went on
        if not seen and getattr(sys, "last_exc", None) is None and getattr(sys, "last_value", None) is None:
            # The job would end "successfully": it must not. (os._exit: an
            # exit handler cannot change the exit status otherwise; the
            # handlers registered before this one do not run.)
            code = EXIT_CODES.get(e.cls, 10) if isinstance(e, CheckpointError) else 10
            logging.shutdown()
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            os._exit(code)


atexit.register(_at_exit)


def encode_value(key: str, v: object) -> bytes:
    """A non-tensor value as stored bytes: JSON when it has a JSON form,
    else a torch.save archive (weights_only loadable); resume decodes both."""
    try:
        return json.dumps(v, allow_nan=True).encode()
    except (TypeError, ValueError):
        pass
    buf = io.BytesIO()
    try:
        torch.save(v, buf)
    except Exception as e:
        raise UsageError(f"{key}: the value {type(v).__name__} cannot be saved: {e}") from e
    return buf.getvalue()


def host_tensor(key: str, t: torch.Tensor) -> torch.Tensor:
    """t (or its local shard) as a contiguous CPU tensor to stage from:
    itself when it already is one (no copy), else a copy."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t

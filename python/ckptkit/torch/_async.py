"""Asynchronous saves through the Go core's saver (saver.Saver, driven by the
C ABI's ckpt_saver_* calls): the state is staged into the saver's pool,
bounded by its staging budget, and the data objects are written in the
background with the metadata committed last. Nothing is staged in Python:
the Go saver copies straight out of the tensors' memory. In the blocking
mode ckpt_saver_save returns once that copy is done; in the overlapped mode
(the default of ``async_save=True``) it returns once the save is planned,
the copy runs in the background while the caller computes, and the
caller's tensors are kept referenced (and must stay unchanged) until
``AsyncSave.staged`` resolves.
"""

import atexit
import concurrent.futures
import ctypes
import io
import json
import logging
import os
import sys
import threading
from typing import Any, Optional, Sequence, Tuple

import torch

from ckptkit import _lib, errors
from ckptkit.errors import CheckpointError, UsageError

log = logging.getLogger("ckptkit")

#: The states of an asynchronous save, as ckpt_save_state numbers them.
STATES = ("staging", "staged", "committed", "failed")


def default_staging_bytes():
    """The Go saver's default staging budget (saver.DefaultStagingBytes)."""
    return int(_lib.lib().ckpt_saver_default_staging_bytes())


class AsyncSaver(_lib.Closing):
    """One saver.Saver of the Go core: its staging pool (at most
    ``staging_bytes`` held at any moment, reused from save to save), at most
    one save in flight, and the rule that a background failure is reported
    by the next save as well as by ``AsyncSave.wait``. With ``overlap`` a
    save returns once planned and stages in the background (the caller
    waits for ``AsyncSave.staged`` before it changes the tensors); with
    ``prefault`` the whole pool is mapped and faulted in now, so that no
    save pays page faults while it copies. Thread-safe."""

    def __init__(self, staging_bytes: Optional[int] = None, *, overlap: bool = False, prefault: bool = False) -> None:
        self._h = 0
        self._close_lock = threading.Lock()
        self._last: Optional[AsyncSave] = None  # the newest AsyncSave
        self.staging_bytes = default_staging_bytes() if staging_bytes is None else int(staging_bytes)
        self.overlap = bool(overlap)
        self.prefault = bool(prefault)
        h = ctypes.c_size_t(0)
        opts = {"staging_bytes": self.staging_bytes, "overlap": self.overlap, "prefault": self.prefault}
        _lib.call("ckpt_saver_open", json.dumps(opts).encode(), ctypes.byref(h))
        self._h = h.value

    def _handle(self) -> int:
        h = self._h
        if not h:
            raise UsageError("the saver is closed")
        return h

    def save(self, url: str, spec: dict[str, Any], tensors: Sequence[Tuple[dict[str, Any], torch.Tensor]]) -> "AsyncSave":
        """Start the save of one rank's state to the checkpoint url: spec is
        the C ABI's save spec (capi/saver.go saveSpec) without the
        tensors, tensors a list of (spec entry, contiguous CPU tensor).
        Returns an AsyncSave once the state is staged (overlap: once the
        save is planned; the tensors stay referenced until it is staged).
        Ctrl-C during the call aborts the save (nothing is committed)."""
        entries, ptrs = [], []
        for entry, t in tensors:
            nbytes = t.numel() * t.element_size()
            entry = dict(entry, nbytes=nbytes, buf=len(ptrs))
            ptrs.append(t.data_ptr() if nbytes else None)
            entries.append(entry)
        spec = dict(spec, tensors=entries)
        arr = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        out = ctypes.c_size_t(0)
        # tensors stays referenced for the whole call: the Go saver reads
        # their memory until the state is staged, and never after (with
        # overlap the AsyncSave keeps them until then).
        _lib.call("ckpt_saver_save", self._handle(), url.encode(), _lib.environment(), json.dumps(spec).encode(), arr,
                  len(ptrs), ctypes.byref(out))
        self._last = AsyncSave(out.value, url, keep=list(tensors) if self.overlap else None, saver=self)
        return self._last

    def stats(self):
        """The staging figures: budget_bytes, pool_bytes (allocated),
        held_bytes (now), peak_bytes (since the saver was created)."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_saver_stats", self._handle(), ctypes.byref(out))
        return json.loads(_lib.take_string(out.value))

    def idle(self):
        """Wait for the save in flight; raise its error if it failed and no
        save reported it yet."""
        _lib.call("ckpt_saver_idle", self._handle(), 0)

    def cancel(self):
        """Abort the save in flight, if any: it fails with CanceledError and
        commits nothing."""
        h = self._h
        if h:
            _lib.call("ckpt_saver_cancel", h)

    def close(self):
        """Wait for the save in flight and release the saver (idempotent);
        raises the save's error like idle()."""
        with self._close_lock:
            h, self._h = self._h, 0
        if h:
            _lib.call("ckpt_saver_idle", h, 1)


class AsyncSave:
    """An asynchronous save returned by ``ckptkit.torch.save(...,
    async_save=True)``. Thread-safe.

    ``staged`` is a ``concurrent.futures.Future`` that resolves (to None)
    once the save no longer reads the caller's tensors; ``wait_staged()``
    waits for it. With ``async_save=True`` ("overlap") save() returns once
    the save is planned and the state is copied in the background: the
    caller must not change its tensors (an optimizer step, a load into
    them) until then, so it calls ``wait_staged()`` right before
    ``optimizer.step()``. With ``async_save="blocking"`` save() returns once
    staged and ``staged`` is already resolved. The data is then written in
    the background and committed last.

    ``wait(timeout=None)`` returns the checkpoint URL once committed, or
    raises the save's error (the ckptkit exception of its class); a
    staging failure, like an upload failure, is raised there and by the
    next save, never by ``wait_staged()``, which only says the tensors are
    free. ``done()`` tells whether it has ended; ``status`` is "staging",
    "staged", "committed" or "failed"; ``result`` (after wait) holds the Go
    saver's figures: bytes_written, seconds (start to commit),
    stall_seconds (how long save() blocked: waiting for the previous save,
    planning, and in the blocking mode staging), staging_seconds (planning
    and staging, however long the caller was blocked by them).
    """

    def __init__(self, handle: int, url: str, *, keep: Optional[list[Any]] = None,
                 saver: Optional[AsyncSaver] = None) -> None:
        self._h = handle
        self.url = url
        self.result: Optional[dict[str, Any]] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()  # one wait() at a time
        # Guards the Go handle: status() may run while wait() blocks, and
        # must never query a handle wait() or __del__ released.
        self._hlock = threading.Lock()
        self._released = False
        self._saver = saver
        #: Resolves once the save no longer reads the caller's tensors.
        self.staged: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.staged.set_running_or_notify_cancel()
        self._keep = keep
        if keep is None:
            self.staged.set_result(None)
        else:
            # The tensors (and the host copies made for the save) stay
            # referenced (self._keep) until the Go saver has copied them.
            threading.Thread(target=self._watch_staged, name="ckptkit-staged", daemon=True).start()

    def _watch_staged(self) -> None:
        done = ctypes.c_int(0)
        try:
            _lib.call("ckpt_save_wait_staged", self._h, -1, ctypes.byref(done))
        except BaseException as e:
            self.staged.set_exception(e)
            return
        finally:
            self._keep = None
        self.staged.set_result(None)

    def wait_staged(self, timeout: Optional[float] = None) -> None:
        """Wait until the save no longer reads the tensors (at most timeout
        seconds: TimeoutError after that, the save goes on). Call it before
        changing them. Ctrl-C while waiting aborts the save (its staging
        stops, nothing is committed) and propagates once the tensors are
        free. Whether the save succeeds is wait()'s answer."""
        try:
            _lib.wait_future(self.staged, timeout)  # in slices: Ctrl-C comes at once
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the save to {self.url} is still staging after {timeout} s") from None
        except BaseException:
            if not self.staged.done() and self._saver is not None:
                # Interrupted: stop the staging, and return only once the
                # Go saver has let go of the tensors.
                self._saver.cancel()
                _lib.wait_out(self.staged)
            raise

    def cancel(self) -> None:
        """Abort the save if it is still running, staging included: it fails
        with CanceledError (raised by wait() and by the next save) and
        commits nothing; the tensors are free once ``staged`` resolves."""
        if self._saver is not None and not self.done():
            self._saver.cancel()

    def _release(self):
        with self._hlock:
            if not self._released:
                self._released = True
                _lib.call("ckpt_save_release", self._h)

    def __del__(self):
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
                    self.result = json.loads(_lib.take_string(out.value))
                if self.result is not None or self._error is not None:
                    # The save has ended, so it is staged: let the watcher
                    # of staged finish its call on the handle first.
                    concurrent.futures.wait([self.staged])
                    self._release()
            if self._error is not None:
                raise self._error
            return self.url

    def __repr__(self):
        return f"<AsyncSave {self.url} {self.status}>"


_saver: Optional[AsyncSaver] = None
_saver_lock = threading.Lock()


def saver_for(staging_bytes: Optional[int], overlap: bool = False, prefault: bool = False) -> AsyncSaver:
    """The process's saver, with the staging budget (None: the Go default)
    and the modes asked for. A saver of another budget or mode is replaced
    once its save in flight has ended (raising that save's failure if no
    save reported it yet)."""
    global _saver
    budget = default_staging_bytes() if staging_bytes is None else int(staging_bytes)
    with _saver_lock:
        if _saver is not None and (budget, bool(overlap), bool(prefault)) != (
                _saver.staging_bytes, _saver.overlap, _saver.prefault):
            old, _saver = _saver, None
            old.close()
        if _saver is None:
            _saver = AsyncSaver(budget, overlap=overlap, prefault=prefault)
        return _saver


def current_saver():
    """The process's saver, or None before the first asynchronous save."""
    return _saver


def close():
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
EXIT_CODES = {errors.BAD_CHECKPOINT: 1, errors.USAGE: 2, errors.NOT_FOUND: 3, errors.ACCESS: 4, errors.TRANSIENT: 5,
              errors.CONFLICT: 6, errors.UNSUPPORTED: 7, errors.CANCELED: 130}


def _interrupted():
    """The exception the interpreter is exiting with, when it is Ctrl-C or
    a cancellation (uncaught: the interpreter printed it), else None."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc if isinstance(exc, (KeyboardInterrupt, errors.CanceledError)) else None


def _at_exit():
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
            code = EXIT_CODES.get(getattr(e, "cls", None), 10)
            logging.shutdown()
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            os._exit(code)


atexit.register(_at_exit)


def encode_value(key, v):
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


def host_tensor(key, t):
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

"""ckptkit for PyTorch: DCP storage on every ckptkit URL and the resume rules
as one call.

    from ckptkit.torch import save, resume, StorageWriter, StorageReader

    save("s3://b/run7?endpoint=...", model, optim, step=100, scheduler=sched)
    rep = resume("s3://b/run7?endpoint=...", model, optim, scheduler=sched)
    start = 0 if rep is None else rep.step

Supported: torch >= 2.4 (tested on 2.6 and 2.14); any torch.optim.Optimizer
(or one following its protocol) or a list of them; plain modules, DDP, and
DTensor-sharded parameters (the FSDP2 layout), on any world size; resuming on
another world size. docs/TORCH.md documents it.
"""

import atexit
import base64
import collections
import ctypes
import dataclasses
import json
import logging
import os
import threading
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict

from ckptkit import _lib
from ckptkit.errors import (
    BadCheckpointError,
    CanceledError,
    CheckpointError,
    NotFoundError,
    UnsupportedError,
    UsageError,
)

from . import _async
from ._async import AsyncSave, AsyncSaver
from ._storage import Checkpoint, StorageReader, StorageWriter, census_members, decode_integrity, encode_integrity

__all__ = ["StorageWriter", "StorageReader", "Checkpoint", "save", "resume", "ResumeReport", "step_url",
           "AsyncSave", "AsyncSaver", "close",
           "encode_integrity", "decode_integrity", "census_members"]

log = logging.getLogger("ckptkit")

#: Top-level keys of the state ckptkit.torch.save writes.
MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
SCHEDULER_KEY = "scheduler"
STEP_KEY = "step"

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.complex64: "complex64",
}


def _layout(run_url, step):
    """The run's layout as the Go core's package run owns it: {step_name,
    step_url, coord_url} of step under run_url (query parameters kept)."""
    out = ctypes.c_void_p()
    _lib.call("ckpt_run_layout", os.fspath(run_url).encode(), int(step), ctypes.byref(out))
    return json.loads(_lib.take_string(out.value))


def step_url(run_url, step):
    """The checkpoint URL of step under run_url: run_url/step-<8 digits>
    (query parameters of the run URL kept)."""
    return _layout(run_url, step)["step_url"]


def _rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _unwrap(model):
    """The module whose names the checkpoint uses: without the wrappers
    that prefix every key, DistributedDataParallel/DataParallel
    (``module.``) and torch.compile's OptimizedModule (``_orig_mod.``), as
    torch's get_state_dict strips them; so a compiled or wrapped model's
    checkpoint resumes into the plain module and the reverse."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def _param_names(model):
    return {id(p): name for name, p in _unwrap(model).named_parameters()}


_PROTOCOL = ("state", "param_groups", "state_dict", "load_state_dict", "step")


def _optimizers(optimizer):
    """The optimizers of optimizer (one, or a list or tuple of them) as a
    list. Each must follow torch.optim.Optimizer's protocol (state,
    param_groups, state_dict, load_state_dict, step)."""
    if optimizer is None:
        return []
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not opts:
        raise UsageError("the list of optimizers is empty")
    for o in opts:
        missing = [a for a in _PROTOCOL if not hasattr(o, a)]
        if missing:
            raise UsageError(f"{type(o).__name__} is not an optimizer: it lacks {', '.join(missing)} "
                             "(torch.optim.Optimizer's protocol)")
    return opts


def _group_fqns(model, optimizer):
    """The FQNs of each param group's parameters, in group order (the groups
    of every optimizer of a list, in list order)."""
    names = _param_names(model)
    out = []
    seen = set()
    for o in _optimizers(optimizer):
        for g in o.param_groups:
            fqns = []
            for p in g["params"]:
                if id(p) not in names:
                    raise UsageError("the optimizer holds a parameter that is not a parameter of the model")
                if id(p) in seen:
                    raise UsageError(f"parameter {names[id(p)]} is in two param groups (or two optimizers)")
                seen.add(id(p))
                fqns.append(names[id(p)])
            out.append(fqns)
    return out


def _optimizer_state(model, optimizer):
    """The optimizer's state keyed by parameter FQN, as torch's
    get_optimizer_state_dict lays it out (state.<fqn>.<slot>,
    param_groups.<i>.<field>, params listing FQNs), without initialising
    any state. A list of optimizers gives one merged state: every
    optimizer's state by FQN, the param groups concatenated in list order
    (get_optimizer_state_dict(model, [o1, o2]))."""
    state, groups = {}, []
    for o in _optimizers(optimizer):
        osd = o.state_dict()
        fqns = _group_fqns(model, o)
        idx2fqn = {}
        i = 0
        for group in fqns:
            for f in group:
                idx2fqn[i] = f
                i += 1
        state.update({idx2fqn[idx]: dict(s) for idx, s in osd["state"].items()})
        for g, names in zip(osd["param_groups"], fqns):
            g = dict(g)
            g["params"] = list(names)
            groups.append(g)
    return {"state": state, "param_groups": groups}


def _census(osd):
    """{fqn: slot names, or None for a parameter without saved state} of a
    merged optimizer state (what StorageWriter's census records). A slot
    name is a key suffix the checkpoint holds under
    optimizer.state.<fqn>. (a nested value's path joined with '.')."""
    out = {}
    for g in osd["param_groups"]:
        for f in g["params"]:
            out[f] = None
    for f, st in osd["state"].items():
        out[f] = list(flatten_state_dict(st)[0]) if isinstance(st, dict) else []
    return out


def save(run_url, model, optimizer=None, *, step, scheduler=None, save_optimizer=True, extra_state=None,
         async_save=False, staging_bytes=None, prefault=False, local=None, persist_every=None, local_keep=None,
         **writer_options):
    """Write run_url/step-<8 digits>/, collectively over the default process
    group (or alone without one): the model, the optimizer (FQN keyed;
    unless save_optimizer=False, which still saves the step and the
    scheduler and records the optimizer as deliberately omitted), the
    scheduler, the step and extra_state (a dict of further top-level keys).
    optimizer is a torch.optim.Optimizer (or one following its protocol) or
    a list or tuple of them, saved as one merged state (the layout of
    torch's get_optimizer_state_dict(model, [o1, o2])); the integrity object
    records its census (each parameter's slot names).

    By default it writes a DCP checkpoint through StorageWriter and returns
    the checkpoint URL once committed. With async_save the Go core's
    asynchronous saver writes it in ckptkit's native format and save
    returns an AsyncSave: the state is staged (copied out of the tensors
    into the saver's pool, which never holds more than staging_bytes,
    default 512 MiB: a larger state is staged in pieces as uploads drain
    them), then written in the background; wait() returns the URL once
    committed or raises the save's error, which the next save raises too.
    async_save=True (or "overlap") returns once the save is planned and
    stages while the caller computes: the caller must not change its
    tensors until the AsyncSave's ``staged`` future resolves, so it calls
    ``wait_staged()`` right before ``optimizer.step()``.
    async_save="blocking" returns once staged, so the caller may change its
    tensors at once. prefault=True maps and faults in the whole staging
    pool at the first save (the budget's memory from then on), so that no
    save pays page faults while it copies. At most one save is in flight
    per process: a save first waits for the previous one.

    With local=LOCAL_URL (this process's node-local tier, e.g. a directory
    on the node's disk or /dev/shm) the run is tiered (the Go core's
    run.Tiered, docs/TIERS.md): every rank saves the whole state (it must
    be replicated: a plain or DDP model, not DTensor) to its own local tier,
    committed when save returns the local step's URL; every persist_every-th
    step (default: every one) rank 0 then copies it to run_url in the
    background (CRC-checked, metadata last, one copy in flight, a newer step
    superseding a queued one); the local tier keeps local_keep steps
    (default 2). A persist that failed is raised by the next save (or by
    close()), never dropped. The options of a run's first tiered save hold
    until close()."""
    sd = {MODEL_KEY: _unwrap(model).state_dict(), STEP_KEY: int(step)}
    record = "none"
    census = None
    if optimizer is not None:
        if save_optimizer:
            sd[OPTIMIZER_KEY] = _optimizer_state(model, optimizer)
            census = _census(sd[OPTIMIZER_KEY])
            record = "saved"
        else:
            record = "omitted"
    elif not save_optimizer:
        record = "omitted"
    if scheduler is not None:
        sd[SCHEDULER_KEY] = scheduler.state_dict()
    for k, v in (extra_state or {}).items():
        if k in sd:
            raise UsageError(f"extra_state key {k!r} is reserved")
        sd[k] = v
    if local is not None:
        return _save_tiered(run_url, local, model, optimizer, sd, int(step), record, census, async_save, staging_bytes,
                            prefault, persist_every, local_keep, writer_options)
    if persist_every is not None or local_keep is not None:
        raise UsageError("persist_every and local_keep are parameters of a tiered save (local=...)")
    url = step_url(run_url, step)
    if async_save not in _ASYNC_MODES:
        raise UsageError(f"async_save={async_save!r}: use False, True (\"overlap\") or \"blocking\"")
    if async_save:
        return _save_async(run_url, url, sd, int(step), record, staging_bytes, writer_options, census,
                           overlap=async_save != "blocking", prefault=prefault)
    if staging_bytes is not None or prefault:
        raise UsageError("staging_bytes and prefault are parameters of async_save")
    prev = _async.current_saver()
    if prev is not None:
        # Never overlap the asynchronous save in flight; its failure, if
        # nothing reported it yet, is this save's error.
        prev.idle()
    try:
        dcp.save(sd, storage_writer=StorageWriter(url, optimizer=record, census=census, **writer_options))
    except BaseException as e:  # torch's CheckpointException is a BaseException
        if _interrupt(e) is not None:
            # Ctrl-C (or a cancellation) during the save: the uploads in
            # flight were aborted, nothing is committed.
            raise _interrupt(e) from e
        inner = _ckptkit_error(e)
        if inner is not None:
            # The storage layer's own error (ConflictError, NotFoundError,
            # ...), torch's per-rank wrapper chained.
            raise inner from e
        raise
    return url


def _interrupt(exc):
    """The KeyboardInterrupt or CanceledError that interrupted a save (exc
    itself, or what torch's CheckpointException wraps), or None."""
    if isinstance(exc, (KeyboardInterrupt, CanceledError)):
        return exc
    for inner in (getattr(exc, "failures", None) or {}).values():
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, (KeyboardInterrupt, CanceledError)):
            return inner
    return None


def _ckptkit_error(exc):
    """The ckptkit error a torch CheckpointException wraps (the first
    rank's that is one), or None."""
    for inner in (getattr(exc, "failures", None) or {}).values():
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, CheckpointError):
            return inner
    return None


_ASYNC_OPTIONS = {"concurrency", "overwrite", "part_size"}

#: The values of save()'s async_save: False (synchronous DCP), True or
#: "overlap" (return once planned), "blocking" (return once staged).
_ASYNC_MODES = (False, True, "overlap", "blocking")

def _refuse_dtensor(model: torch.nn.Module, optimizer: Any, what: str) -> None:
    """UsageError when the model holds DTensor (sharded) parameters: a
    node-local tier holds each rank's whole, replicated state."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor
    for name, p in _unwrap(model).named_parameters():
        if isinstance(p, DTensor):
            raise UsageError(f"{what}: local= takes replicated state (a plain or DDP model); parameter {name} is a "
                             "DTensor (sharded): save and resume it without local=")


def _save_tiered(run_url: str, local: str, model: torch.nn.Module, optimizer: Any, sd: dict[str, Any], step: int,
                 record: str, census: Optional[dict[str, Any]], async_save: Any, staging_bytes: Optional[int],
                 prefault: bool, persist_every: Optional[int], local_keep: Optional[int],
                 writer_options: dict[str, Any]) -> str:
    if async_save:
        raise UsageError("local= does not take async_save=True: the local save is the fast one (commit it "
                         "synchronously, the durable copy is made in the background)")
    _refuse_dtensor(model, optimizer, "save(local=...)")
    for name, v in (("persist_every", persist_every), ("local_keep", local_keep)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UsageError(f"{name} must be a positive int, not {v!r}")
    tier = _tier(run_url, local, persist_every or 0, local_keep or 0, no_persist=_rank() != 0)
    url = step_url(local, step)
    # This rank alone (no coordinator): its node-local tier holds its whole
    # state, in ckptkit's native format, committed when wait() returns.
    _save_async(local, url, sd, step, record, staging_bytes, writer_options, census, overlap=False,
                prefault=prefault, alone=True).wait()
    tier.committed(step)
    return url


class _Tier(_lib.Closing):
    """A tiered run of the Go core (run.Tiered): the local tier of this
    process and the durable run, persisting in the background."""

    def __init__(self, run_url: str, local: str, persist_every: int, local_keep: int, no_persist: bool) -> None:
        h = ctypes.c_size_t(0)
        spec = {"persist_every": persist_every, "local_keep": local_keep, "no_persist": no_persist}
        _lib.call("ckpt_tiered_open", os.fspath(local).encode(), os.fspath(run_url).encode(), _lib.environment(),
                  json.dumps(spec).encode(), ctypes.byref(h))
        self._h = h.value
        self._lock = threading.Lock()

    def committed(self, step: int) -> list[dict[str, Any]]:
        """Tell the run step is committed locally; raise a persist that
        failed since the last call."""
        out = ctypes.c_void_p()
        _lib.call("ckpt_tiered_committed", self._h, int(step), ctypes.byref(out))
        ended: list[dict[str, Any]] = json.loads(_lib.take_string(out.value))
        return ended

    def close(self, grace: Optional[float] = None) -> None:
        """Wait at most grace seconds (None: unbounded) for the persist in
        flight, then cancel what is left and release the run; raise a
        failed persist or the grace running out (idempotent)."""
        with self._lock:
            h, self._h = self._h, 0
        if h:
            ms = 0 if grace is None else max(1, int(grace * 1000))
            if grace is None:
                out = ctypes.c_void_p()
                try:
                    _lib.call("ckpt_tiered_wait", h, 0, ctypes.byref(out))
                    _lib.take_string(out.value)
                except BaseException:
                    _lib.call("ckpt_tiered_close", h, 0)
                    raise
            _lib.call("ckpt_tiered_close", h, ms)


_tiers: dict[tuple[str, str], _Tier] = {}
_tiers_lock = threading.Lock()


def _tier(run_url: str, local: str, persist_every: int, local_keep: int, no_persist: bool) -> _Tier:
    key = (os.fspath(run_url), os.fspath(local))
    with _tiers_lock:
        t = _tiers.get(key)
        if t is None:
            t = _tiers[key] = _Tier(run_url, local, persist_every, local_keep, no_persist)
        return t


def close(persist_grace: Optional[float] = None) -> None:
    """Wait for the asynchronous save in flight, if any, and release the
    process's saver (raising the save's error if no call reported it yet);
    then wait (at most persist_grace seconds, None: until done) for the
    background persists of tiered runs (save(local=...)) and release them,
    raising the first failure. A job calls it after its last save, before
    it reports success; at exit it runs with persist_grace=60."""
    try:
        _async.close()
    finally:
        _close_tiers(persist_grace)


def _close_tiers(grace: Optional[float]) -> None:
    with _tiers_lock:
        tiers = list(_tiers.values())
        _tiers.clear()
    first: Optional[BaseException] = None
    for t in tiers:
        try:
            t.close(grace)
        except BaseException as e:
            first = first or e
    if first is not None:
        raise first


def _close_tiers_at_exit() -> None:
    if _lib.forked():
        return  # a forked child's copies of the parent's runs are not its own
    try:
        _close_tiers(60)
    except Exception as e:
        log.error("tiered run: %s", e)


atexit.register(_close_tiers_at_exit)


def _save_async(run_url, url, sd, step, record, staging_bytes, writer_options, census=None, *, overlap: bool = True,
                prefault: bool = False, alone: bool = False) -> AsyncSave:
    unknown = set(writer_options) - _ASYNC_OPTIONS
    if unknown:
        raise UsageError(f"async_save=True takes {sorted(_ASYNC_OPTIONS)}, not {sorted(unknown)}")
    flat, _ = flatten_state_dict(sd)
    tensors, values = [], {}
    for key, v in flat.items():
        if isinstance(v, torch.Tensor):
            local, shape, offsets = _local(v)
            host = _async.host_tensor(key, local)
            dt = _DTYPES.get(host.dtype)
            if dt is None:
                raise UnsupportedError(f"{key}: dtype {host.dtype} is not supported")
            entry = {"key": key, "dtype": dt, "shape": shape, "sizes": list(host.shape)}
            if offsets is not None:
                entry["offsets"] = offsets
            tensors.append((entry, host))
        else:
            values[key] = base64.b64encode(_async.encode_value(key, v)).decode()
    spec = {"bytes": values, "iteration": step, "no_save_optimizer": record == "omitted",
            "model_prefix": MODEL_KEY, "optimizer_prefix": OPTIMIZER_KEY,
            "overwrite": bool(writer_options.get("overwrite", False)),
            "concurrency": int(writer_options.get("concurrency", 0)),
            "max_object_bytes": int(writer_options.get("part_size", 0))}
    if census:
        # The slot names the optimizer's state holds (the native metadata's
        # optimizer_slots; the Go saver's default is AdamW's).
        spec["optimizer_slots"] = sorted({s for slots in census.values() for s in slots or ()})
    if not alone and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # Ranks are processes: the Go saver of each coordinates through
        # objects under the run's coordinator prefix (coord_url, the Go
        # core's), in a session rank 0 names.
        layout = _layout(run_url, step)
        group = [None]
        if dist.get_rank() == 0:
            group = [f"{layout['step_name']}-{uuid.uuid4().hex}"]
        dist.broadcast_object_list(group, src=0)
        spec["coordinator"] = {"url": layout["coord_url"], "group": group[0],
                               "rank": dist.get_rank(), "world": dist.get_world_size()}
    return _async.saver_for(staging_bytes, overlap, prefault).save(url, spec, tensors)


@dataclass
class ResumeReport:
    """What resume did."""

    #: The step (iteration) the checkpoint was saved at.
    step: int
    #: The checkpoint's URL (credentials redacted).
    url: str
    #: The step in the checkpoint's name (step-<8 digits>); its iteration
    #: otherwise.
    checkpoint_step: int = 0
    #: FQNs whose optimizer state was wholly absent (never received a
    #: gradient before the save) and left fresh.
    lazy_params: list = field(default_factory=list)
    #: False when the optimizer was not loaded (load_optimizer=False, or the
    #: checkpoint deliberately omitted it).
    optimizer_loaded: bool = False
    #: Newer checkpoints of the run that were skipped, with the reason
    #: (dicts with url and reason): uncommitted or invalid ones, and those
    #: whose data turned out damaged while loading.
    skipped: list = field(default_factory=list)
    #: Checkpoint keys nothing asked for.
    extra_keys: list = field(default_factory=list)
    #: The Go loader's one-line summary.
    summary: str = ""
    #: Bytes read and read requests.
    bytes_read: int = 0
    read_requests: int = 0
    #: Param-group and scheduler fields (keys) the checkpoint lacks while it
    #: holds the others (saved by an older torch): they kept their current
    #: values (logged once, WARNING).
    kept_fields: list = field(default_factory=list)
    #: The tier resumed from, with resume(local=...): "local" (every
    #: rank's local copy verified and loaded) or "durable"; None without
    #: local.
    tier: Optional[str] = None
    #: Why that tier (the Go core's words).
    tier_why: str = ""


def _scratch_optimizer(opt, groups):
    """A new optimizer of opt's class over groups (scratch parameters, each
    group with opt's hyper-parameters), built by the class's own code: its
    constructor with opt's defaults, its constructor alone (every
    hyper-parameter is in the groups), or, for constructors that take
    neither, the way unpickling builds one (``__setstate__``, which every
    torch.optim.Optimizer has). Nothing of opt is shared but read-only
    hyper-parameter values: not its state, groups, hooks or step wrappers
    (an LRScheduler patches opt.step)."""
    cls = type(opt)
    defaults = dict(getattr(opt, "defaults", None) or {})
    errors = []
    for how in ("defaults", "groups", "setstate"):
        try:
            if how == "defaults":
                return cls(groups, **defaults)
            if how == "groups":
                return cls(groups)
            scratch = cls.__new__(cls)
            scratch.__setstate__({"defaults": defaults, "state": collections.defaultdict(dict), "param_groups": groups})
            return scratch
        except Exception as e:  # noqa: BLE001 - the next way, then the errors of all
            errors.append(f"{how}: {type(e).__name__}: {e}")
    raise UnsupportedError(f"cannot build a scratch {cls.__name__} to learn its fresh per-parameter state "
                           f"({'; '.join(errors)}); load it with dcp.load(storage_reader=StorageReader(url)) instead")


def _fresh_state(opt, names):
    """{fqn: fresh state} for the parameters of opt: each parameter's
    per-parameter state as the optimizer's own step creates it (the slots,
    their shapes, dtypes and devices, and non-tensor values), from one step
    with zero gradients of a scratch optimizer of the same class over
    scratch parameters (zeros of each parameter's shape, dtype and device)
    with the same param groups and hyper-parameters. opt, its parameters
    and its hyper-parameters are not touched, nor the random number
    generators. Parameters that get no state (requires_grad False, or a
    stateless optimizer) are left out. The values are placeholders the load
    overwrites; the parameters without saved state (lazily absent) are not
    given any."""
    pairs, groups, devices = [], [], set()
    for g in opt.param_groups:
        ps = []
        for p in g["params"]:
            q = torch.zeros_like(p.detach(), memory_format=torch.preserve_format)
            if p.requires_grad:
                q.requires_grad_(True)
                q.grad = torch.zeros_like(q)
            if p.device.type == "cuda":
                devices.add(p.device.index)
            ps.append(q)
            pairs.append((names[id(p)], q))
        g2 = {k: v for k, v in g.items() if k != "params"}
        g2["params"] = ps
        groups.append(g2)
    scratch = _scratch_optimizer(opt, groups)
    try:
        with torch.random.fork_rng(devices=sorted(devices)):
            scratch.step()
    except Exception as e:
        raise UnsupportedError(f"cannot learn {type(opt).__name__}'s fresh per-parameter state: its step with zero "
                               f"gradients on scratch parameters failed ({type(e).__name__}: {e}); load it with "
                               "dcp.load(storage_reader=StorageReader(url)) instead") from e
    out = {}
    for fqn, q in pairs:
        st = scratch.state.get(q)
        if st:
            out[fqn] = dict(st)
    return out


def _local(t):
    """(local tensor, global shape, offsets) of a tensor or DTensor."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor
    if isinstance(t, DTensor):
        try:
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        except ImportError:
            from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
        _, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return t.to_local(), list(t.shape), list(offsets)
    return t, list(t.shape), None


def _like(v, template):
    """A loaded value v with the Python types of the target's value template
    where the stored form lost them: the Go core hands values over as JSON,
    in which a float with an integral value reads back as an int (a
    float step 3.0 as 3) and a tuple as a list."""
    if isinstance(template, float) and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if isinstance(template, (tuple, list)) and isinstance(v, (list, tuple)):
        items = [_like(x, t) for x, t in zip(v, template)] if len(v) == len(template) else list(v)
        return tuple(items) if isinstance(template, tuple) else items
    if isinstance(template, dict) and isinstance(v, dict):
        return {k: _like(x, template.get(k)) for k, x in v.items()}
    return v


def _decode_bytes(raw):
    if raw[:4] == b"PK\x03\x04":
        import io

        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    return json.loads(raw)


def _decode_values(rep, flat, where):
    """The loaded bytes values of rep, decoded (torch.load with
    weights_only=True, or JSON) and typed like the target's values; a value
    that does not decode is a BadCheckpointError naming the key, the
    decoder's error chained."""
    values = {}
    for k, b64 in (rep["bytes"] or [{}])[0].items():
        if b64 is None:
            continue
        try:
            values[k] = _like(_decode_bytes(base64.b64decode(b64)), flat.get(k))
        except Exception as e:
            raise BadCheckpointError(f"{where}: value {k!r} does not decode: {type(e).__name__}: {e}") from e
    return values


def resume(url, model, optimizer=None, *, scheduler=None, load_optimizer=True, frozen=(), extra_state=None,
           optimizer_prefix=OPTIMIZER_KEY, must_exist=False, local=None):
    """Resume model, optimizer and scheduler from the checkpoint at url, or
    from the newest committed checkpoint of the run at url that verifies (as
    `ckpt latest`); returns a ResumeReport, or None when the run has no
    committed checkpoint: a fresh start, logged ("fresh start: nothing
    under URL" or "no committed checkpoint under URL"). With
    must_exist=True a run URL under which nothing is stored raises
    NotFoundError instead (a mistyped URL must not restart training); a
    checkpoint URL (ending in step-<8 digits>) under which nothing is
    stored always raises NotFoundError. Committed checkpoints of which none
    is valid raise the newest one's error, never a fresh start.

    optimizer is what save took (an optimizer, or a list of them in the
    same order). Each parameter's expected optimizer state is what the
    optimizer's own step makes for it (learnt from a scratch optimizer of
    the same class over scratch parameters, touching neither the optimizer
    nor the model). Param-group and scheduler fields the checkpoint lacks
    (added by a newer torch) keep their current values (``kept_fields``).

    The Go core applies every rule of docs/RESUME.md and reads and checks
    every byte before anything is modified: lazily absent optimizer state is
    left fresh and reported (``lazy_params``); partial state raises
    PartialStateError, an optimizer whose saved state matches no parameter
    or whose param groups differ from the checkpoint's (another number of
    groups, a parameter in another group) LayoutMismatchError, chunks that do not tile a tensor CoverageError, a
    bad CRC32C ChecksumError; model keys are strict except the FQNs in
    ``frozen``. load_optimizer=False still restores the step and the
    scheduler (and sets each group's lr from the scheduler). extra_state,
    a dict of further top-level keys, is filled in place. The metadata is
    read once, by the reader that then serves the data.

    The choice is the Go core's (run.ResumeURL, through ckpt_run_resume;
    this function only loads what it chose, in a callback). For a run URL,
    a checkpoint whose data turns out damaged (a CRC32C mismatch, a missing
    or truncated data object) is passed over for the next older valid one,
    as `ckpt train --resume` does: a RuntimeWarning (and the log) names the
    damaged checkpoint and the one used, ``skipped`` lists it (each entry
    {url, reason, why}), and the report describes the one loaded. Such a
    load writes each tensor once (every attempt overwrites every target),
    so when no older checkpoint is valid either the error leaves the
    tensors partly overwritten; a checkpoint URL (no fallback) is loaded
    transactionally. With a process group every rank calls resume: rank 0
    chooses, and ranks that fell back to different checkpoints all reload
    the oldest of them (they agree through the store coordinator under the
    run).

    With local=LOCAL_URL (this process's node-local tier, as save took
    it) the nearest valid copy is taken (run.Tiered.ResumeTiered): the
    newest step every rank's local tier holds and loads, when it is at
    least as new as the durable run's newest valid step, else the durable
    run (all ranks together). ``tier`` says which ("local", "durable") and
    ``tier_why`` why."""
    if local is not None:
        _refuse_dtensor(model, optimizer, "resume(local=...)")
    rank = _rank()
    attempt = _Attempt()

    def load(h: int, raw_info: bytes) -> int:
        # Called by the Go core (ckpt_run_resume) for each checkpoint it
        # chose: a fallback past damage and the ranks agreeing on an older
        # step call it again, and each call overwrites every target.
        ck = Checkpoint._lent(h, json.loads(raw_info))
        try:
            attempt.report = _resume_from(ck, model, optimizer, scheduler, load_optimizer, frozen, extra_state,
                                          optimizer_prefix, bool(ck.info.get("one_pass")), attempt.scope)
            attempt.error = None
            return 0
        except BaseException as e:  # never into the Go core: it reports the failure
            attempt.error, attempt.from_go = e, ck.load_failed
            if not ck.load_failed:
                try:
                    _lib.call("ckpt_checkpoint_fail", h, int(getattr(e, "cls", None) or 0),
                              getattr(e, "rule", None) and str(e.rule).encode(),
                              f"{ck.url}: {type(e).__name__}: {e}".encode())
                except Exception:  # the Go core then says the callback failed
                    pass
            return 1
        finally:
            ck.close()

    spec = {"allow_fresh": not must_exist, "coordinator": _coordinator("resume"),
            "local": "" if local is None else os.fspath(local)}
    fn = _lib.LOAD_FN(load)
    out = ctypes.c_void_p()
    with _lib.CancelScope() as attempt.scope:
        try:
            _lib.call("ckpt_run_resume", os.fspath(url).encode(), _lib.environment(), json.dumps(spec).encode(),
                      ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(out), scope=attempt.scope)
        except BaseException:
            if attempt.error is not None and not attempt.from_go:
                raise attempt.error  # this rank's own failure (the Go error only names it)
            raise
    res = json.loads(_lib.take_string(out.value))
    if res["fresh"]:
        if res["empty"]:
            log.info("fresh start: nothing under %s", res["url"])
        else:
            log.info("fresh start: no committed checkpoint under %s", res["url"])
        return None
    rep = attempt.report
    for s in res["skipped"]:
        if s["why"] == "damaged":
            msg = (f"checkpoint {s['url']} is damaged ({s['reason']}); resuming from the next older valid checkpoint, "
                   f"{res['url']}")
            # Once: a RuntimeWarning (logging.captureWarnings routes it to
            # the log); the log gets it at DEBUG only, not a second WARNING.
            log.debug("%s", msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
    step = res["step"] if res["step"] >= 0 else res["iteration"]
    out_rep = dataclasses.replace(rep, url=res["url"], checkpoint_step=int(step),
                                  skipped=[{"url": s["url"], "reason": s["reason"], "why": s["why"]} for s in res["skipped"]],
                                  tier=res["tier"] or None, tier_why=res["tier_why"])
    if rank == 0:
        log.info("%s", out_rep.summary)
        if out_rep.kept_fields:
            log.warning("%d param-group or scheduler field(s) are not in checkpoint %s (saved by an older torch?); "
                        "kept their current values: %s", len(out_rep.kept_fields), out_rep.url,
                        ", ".join(out_rep.kept_fields))
    return out_rep


class _Attempt:
    """The state of a resume's load callback: the last load's report, and
    the failure of the last one (whether it was the Go loader's)."""

    def __init__(self) -> None:
        self.report: Optional[ResumeReport] = None
        self.error: Optional[BaseException] = None
        self.from_go = False
        self.scope: Optional[_lib.CancelScope] = None


def _coordinator(kind: str) -> Optional[dict[str, Any]]:
    """The store coordinator's group of a collective call of the Go core
    over the default process group (None alone): a name rank 0 makes
    unique, and this rank's place."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    group = [None]
    if dist.get_rank() == 0:
        group = [f"{kind}-{uuid.uuid4().hex}"]
    dist.broadcast_object_list(group, src=0)
    return {"group": group[0], "rank": dist.get_rank(), "world": dist.get_world_size()}


def _resume_from(ck, model, optimizer, scheduler, load_optimizer, frozen, extra_state, optimizer_prefix, one_pass,
                 scope=None):
    """Load ck into the targets (the whole resume of one checkpoint): in
    one pass when one_pass (a resume that may load another checkpoint
    after this one), else transactionally. Returns its ResumeReport."""
    saved_keys = ck.keys()
    m = _unwrap(model)
    target = {MODEL_KEY: m.state_dict()}
    fqns = None
    opts = _optimizers(optimizer)
    if opts and load_optimizer:
        fqns = _group_fqns(model, opts)
        names = _param_names(model)
        # Each parameter's expected slots are those of its own fresh state,
        # as its optimizer's code makes it (the Go loader judges each
        # parameter by the slots its target holds).
        state = {}
        for o in opts:
            state.update(_fresh_state(o, names))
        target[optimizer_prefix] = {"state": state, "param_groups": _optimizer_state(model, opts)["param_groups"]}
    if scheduler is not None:
        target[SCHEDULER_KEY] = scheduler.state_dict()
    if STEP_KEY in saved_keys:
        target[STEP_KEY] = 0
    for k, v in (extra_state or {}).items():
        target[k] = v
    flat, mapping = flatten_state_dict(target)
    kept = _absent_fields(flat, saved_keys, optimizer_prefix if fqns is not None else None)

    tensors, bytes_keys, buffers, copies = [], [], [], []
    for key, v in flat.items():
        if isinstance(v, torch.Tensor):
            local, shape, offsets = _local(v)
            dst = local
            if local.device.type != "cpu":
                # The Go loader writes host memory: a tensor on another
                # device is loaded into a CPU buffer (pinned for CUDA, so
                # the copy is a DMA) and copied to it once every check has
                # passed (docs/TORCH.md, "Devices").
                dst = torch.empty(local.shape, dtype=local.dtype, device="cpu",
                                  pin_memory=local.device.type == "cuda" and torch.cuda.is_available())
                copies.append((local, dst))
            elif not local.is_contiguous():
                dst = local.contiguous()
                copies.append((local, dst))
            dt = _DTYPES.get(dst.dtype)
            if dt is None:
                raise UnsupportedError(f"{key}: dtype {dst.dtype} is not supported")
            nbytes = dst.numel() * dst.element_size()
            spec = {"key": key, "dtype": dt, "shape": shape, "sizes": list(dst.shape), "nbytes": nbytes, "buf": len(buffers)}
            if offsets is not None:
                spec["offsets"] = offsets
            buffers.append(dst.data_ptr() if nbytes else None)
            tensors.append(spec)
        else:
            bytes_keys.append(key)
    spec = {
        "targets": [{"tensors": tensors, "bytes": bytes_keys}],
        "no_load_optimizer": not (optimizer is not None and load_optimizer),
        "model_prefix": MODEL_KEY,
        "optimizer_prefix": optimizer_prefix,
        "frozen": [f"{MODEL_KEY}.{f}" for f in frozen],
        "quiet": True,
    }
    if fqns is not None:
        # The Go loader compares them with the checkpoint's param groups
        # before any buffer is written (a LayoutMismatchError otherwise).
        spec["param_groups"] = fqns
    if one_pass:
        spec["one_pass"] = True
    if bytes_keys:
        # The values Python decodes (param groups, scheduler, step, extra
        # state) are read and decoded first, so one that does not decode
        # fails the resume before any tensor is written. In one pass (the
        # Go core may fall back) a damaged checkpoint is left to the load
        # below, whose error the Go core judges.
        pre = dict(spec, targets=[{"tensors": [], "bytes": bytes_keys}], one_pass=False)
        try:
            pre_rep = ck.load(pre, [], scope=scope)
        except CheckpointError:
            if not one_pass:
                raise
        else:
            _decode_values(pre_rep, flat, ck.url)
    # Every rule is checked before any buffer is written, and every CRC
    # (unless one_pass) too.
    rep = ck.load(spec, buffers, scope=scope)
    for local, dst in copies:
        local.copy_(dst)

    values = _decode_values(rep, flat, ck.url)
    for k, v in values.items():
        flat[k] = v
    nested = unflatten_state_dict(flat, mapping)

    lazy = list(rep["lazy_params"])
    loaded_optim = bool(rep["optimizer_loaded"]) and optimizer is not None and load_optimizer
    if loaded_optim:
        _apply_optimizer(model, opts, nested[optimizer_prefix], set(lazy))
    if scheduler is not None and SCHEDULER_KEY in nested:
        scheduler.load_state_dict(nested[SCHEDULER_KEY])
        if opts and not loaded_optim:
            # The LR is part of the schedule: a fresh optimizer takes it over
            # (the scheduler's own optimizer, of a list).
            sched_opt = getattr(scheduler, "optimizer", None)
            if not any(sched_opt is o for o in opts):
                sched_opt = opts[0]
            for g, lr in zip(sched_opt.param_groups, scheduler.get_last_lr()):
                g["lr"] = lr
    for k in extra_state or {}:
        extra_state[k] = nested[k]
    step = rep["iteration"]
    if STEP_KEY in nested and isinstance(nested[STEP_KEY], int):
        step = nested[STEP_KEY]
    return ResumeReport(step=int(step), url=ck.url, checkpoint_step=0, lazy_params=lazy,
                        optimizer_loaded=loaded_optim, skipped=[], extra_keys=list(rep["extra_keys"]),
                        summary=rep["summary"], bytes_read=rep["bytes_read"],
                        read_requests=rep["read_requests"], kept_fields=kept)


def _absent_fields(flat, saved_keys, optimizer_prefix):
    """Drop from flat (the load target) the param-group fields and scheduler
    fields that the checkpoint lacks while it holds others of its kind:
    those a newer torch added (torch 2.14's AdamW decoupled_weight_decay,
    LRScheduler _is_initial). They keep their current values. Each group's
    params, the per-parameter state and the model are never dropped: the Go
    loader judges them. Returns the keys dropped, sorted."""
    prefixes = [f"{SCHEDULER_KEY}."]
    if optimizer_prefix is not None:
        prefixes.append(f"{optimizer_prefix}.param_groups.")
    dropped = []
    for prefix in prefixes:
        if not any(k.startswith(prefix) for k in saved_keys):
            continue  # none of them saved: the Go loader says what that means
        for k in list(flat):
            if not k.startswith(prefix) or k in saved_keys:
                continue
            if prefix != prefixes[0] and k.endswith(".params") and k[len(prefix):].count(".") == 1:
                continue  # a group's parameter list: the param-group rule
            del flat[k]
            dropped.append(k)
    return sorted(dropped)


def _apply_optimizer(model, optimizer, loaded, lazy):
    """Install the loaded optimizer state with each optimizer's own
    load_state_dict (the merged state of a list split back by each
    optimizer's param groups, which come in list order), leaving the lazily
    absent parameters without state (fresh), which works on every torch
    version (torch < 2.10's set_optimizer_state_dict raises a bare KeyError
    for such an FQN). A param-group field the checkpoint lacks (added by a
    newer torch) keeps its current value. The Go loader has already checked
    that the checkpoint's param groups hold the optimizer's parameters (the
    spec's param_groups), before it wrote any buffer."""
    gi = 0
    for o in _optimizers(optimizer):
        fqns = _group_fqns(model, o)
        state, groups, idx = {}, [], 0
        for cur, names in zip(o.param_groups, fqns):
            g = dict(loaded["param_groups"][gi])
            gi += 1
            for k, v in cur.items():
                if k == "params":
                    continue
                if k not in g:
                    g[k] = v
            ids = []
            for f in names:
                if f not in lazy and f in loaded["state"]:
                    state[idx] = loaded["state"][f]
                ids.append(idx)
                idx += 1
            g["params"] = ids
            groups.append(g)
        o.load_state_dict({"state": state, "param_groups": groups})

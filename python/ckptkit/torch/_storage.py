"""DCP StorageWriter and StorageReader on every ckptkit URL.

They write and read the standard DCP layout (data files of concatenated
``torch.save`` items plus a pickled ``.metadata``), so torch's own
FileSystemReader loads a ``file://`` checkpoint they wrote, and every
``ckpt`` command works on it. On top of the layout:

* every object a save writes is named for that save: data files
  ``__<rank>_<n>.<tag>.distcp`` and the integrity object
  ``.ckptkit-integrity.<tag>``, where tag is the short form of the save id
  recorded in ``.metadata`` (``storage_meta.save_id``, see save_tag), so
  two saves to one URL never write the same object;
* every item gets a CRC32C, recorded in the integrity object written before
  ``.metadata`` (docs/TORCH_DCP.md); StorageReader checks every byte it
  reads against it;
* ``.metadata`` is written last and create-if-absent where the backend has
  it: it is the only commit point. An overwrite removes the old
  ``.metadata`` before any data of the new save is written, and the old
  checkpoint's objects once the new one is committed;
* StorageReader reads ``.metadata`` exactly once per load (through the Go
  core, which also checks it with its restricted unpickler before Python
  unpickles it) and serves every data read itself: coalesced ranged reads,
  concurrent, CRC-checked.
"""

import collections.abc
import concurrent.futures
import ctypes
import dataclasses
import io
import json
import logging
import os
import pickle
import queue
import sys
import threading
import time
import uuid
import warnings
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union, cast

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader as _TorchStorageReader
from torch.distributed.checkpoint.storage import StorageWriter as _TorchStorageWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

import ckptkit
from ckptkit import _lib
from ckptkit._lib import CancelScope
from ckptkit._wire import CheckpointInfo, LoadInfo, LoadReport
from ckptkit.errors import ChecksumError, ConflictError, NotFoundError, UnsupportedError, UsageError

from ._crcs import CRCMap, ItemKey, read_item_crcs
from ._restricted import ForbiddenGlobalError, check_item, load_metadata
from ._torchsave import locate_storage, view_tensor

METADATA_KEY = ".metadata"
# The integrity object's fixed name before objects were named per save;
# readers fall back to it (integrity_key).
INTEGRITY_KEY = ".ckptkit-integrity"
SAVE_TAG_LEN = 16
INTEGRITY_HEADER_SIZE = 64
DEFAULT_PART_SIZE = 64 << 20
DEFAULT_CONCURRENCY = 4
#: Where StorageWriter starts each item in its object: a multiple of this
#: many bytes (see _Part).
ITEM_ALIGN = 64
#: StorageReader reads two items in one request when at most this many
#: bytes lie between them (read and skipped).
COALESCE_GAP = 64 << 10
DEFAULT_MAX_READ = 32 << 20
# Tensor items of at least this many bytes are read straight into their
# targets (StorageReader in_place_min); smaller ones are coalesced into
# buffered reads.
DEFAULT_IN_PLACE_MIN = 1 << 20
# How much of an item's start is read to find its storage record.
HEAD_BYTES = 4096

log = logging.getLogger("ckptkit")


#: A checkpoint URL, or a local path.
CheckpointID = Union[str, "os.PathLike[str]"]
#: A census as census_members takes it.
Census = Mapping[str, Any]


def _url_of(checkpoint_id: CheckpointID) -> str:
    s = os.fspath(checkpoint_id)
    if "://" not in s:
        s = "file://" + os.path.abspath(s)
    return s


def save_tag(save_id: object) -> str:
    """The short form of a save id that names a save's objects: its first
    SAVE_TAG_LEN characters without dashes when they are lowercase hex
    digits (a uuid4's are), else "" (no per-save names). The Go reader
    (interop/torchdcp SaveTag) applies the same rule."""
    if not isinstance(save_id, str):
        return ""
    tag: List[str] = []
    for ch in save_id:
        if len(tag) == SAVE_TAG_LEN:
            break
        if ch == "-":
            continue
        if ch not in "0123456789abcdef":
            return ""
        tag.append(ch)
    return "".join(tag) if len(tag) == SAVE_TAG_LEN else ""


def integrity_key(save_id: object) -> str:
    """The integrity object's key for the save save_id:
    ``.ckptkit-integrity.<tag>``, or the legacy ``.ckptkit-integrity``
    when the id has no tag."""
    tag = save_tag(save_id)
    return f"{INTEGRITY_KEY}.{tag}" if tag else INTEGRITY_KEY


def _save_id_of(md: object) -> Optional[str]:
    """storage_meta.save_id of a DCP Metadata, or None."""
    sid = getattr(getattr(md, "storage_meta", None), "save_id", None)
    return sid if isinstance(sid, str) else None


_CENSUS_MEMBERS = ("params", "slot_sets", "param_slots")


def _bytewise(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def census_members(census: Census) -> Dict[str, Any]:
    """The census of an optimizer's state as the integrity object records it:
    {"params": the parameter FQNs, sorted bytewise, distinct; "slot_sets":
    the distinct slot-name lists, each non-empty and sorted bytewise without
    duplicates; "param_slots": per parameter of params, the index of its
    slot set, or -1 when the parameter has no saved state (lazily absent,
    or a state that holds nothing: no key of it is saved)}.

    census is either a mapping {fqn: iterable of slot names, or None for no
    saved state}, or those three members (a mapping with exactly the keys
    params, slot_sets and param_slots, param_slots a list of ints), which
    are checked and returned normalized. Slot sets are numbered in the order
    params first uses them."""
    if not isinstance(census, collections.abc.Mapping):
        raise UsageError(f"census: a mapping of FQN to slot names, or params/slot_sets/param_slots, not "
                         f"{type(census).__name__}")
    if set(census) == set(_CENSUS_MEMBERS) and isinstance(census["param_slots"], (list, tuple)) \
            and all(isinstance(i, int) and not isinstance(i, bool) for i in census["param_slots"]):
        given, given_sets, idx = list(census["params"]), list(census["slot_sets"]), list(census["param_slots"])
        if len(given) != len(idx):
            raise UsageError(f"census: {len(given)} params but {len(idx)} param_slots")
        for i in idx:
            if not -1 <= i < len(given_sets):
                raise UsageError(f"census: param_slots index {i} outside slot_sets (0..{len(given_sets) - 1}, or -1)")
        by_param: Dict[str, Any] = {}
        for f, i in zip(given, idx):
            if not isinstance(f, str):
                raise UsageError(f"census: parameter {f!r} is not a string")
            if f in by_param:
                raise UsageError(f"census: parameter {f} listed twice")
            by_param[f] = None if i < 0 else given_sets[i]
        census = by_param
    per: Dict[str, Optional[Tuple[str, ...]]] = {}
    for f, slots in census.items():
        if not isinstance(f, str):
            raise UsageError(f"census: parameter {f!r} is not a string")
        if slots is None:
            per[f] = None
            continue
        if isinstance(slots, str):
            raise UsageError(f"census: the slots of {f} must be an iterable of names, not a string")
        names = set()
        for n in slots:
            if not isinstance(n, str) or not n:
                raise UsageError(f"census: slot {n!r} of {f} is not a non-empty string")
            names.add(n)
        per[f] = tuple(sorted(names, key=_bytewise)) or None
    params = sorted(per, key=_bytewise)
    sets: List[List[str]] = []
    index: Dict[Tuple[str, ...], int] = {}
    param_slots: List[int] = []
    for f in params:
        s = per[f]
        if not s:
            param_slots.append(-1)
            continue
        if s not in index:
            index[s] = len(sets)
            sets.append(list(s))
        param_slots.append(index[s])
    return {"params": params, "slot_sets": sets, "param_slots": param_slots}


def encode_integrity(items: Sequence[Mapping[str, Any]], optimizer: Optional[str] = None,
                     census: Optional[Census] = None) -> bytes:
    """The integrity object's bytes: a 64-byte header line
    ``ckptkit-dcp-integrity/1 <size>`` and a JSON body (docs/TORCH_DCP.md).
    census (see census_members), when given, records the optimizer state's
    census: the members params, slot_sets and param_slots."""
    body: Dict[str, Any] = {"algorithm": "crc32c", "items": items}
    if optimizer:
        body["optimizer"] = optimizer
    if census is not None:
        body.update(census_members(census))
    raw = json.dumps(body, separators=(",", ":")).encode()
    total = INTEGRITY_HEADER_SIZE + len(raw)
    head = f"ckptkit-dcp-integrity/1 {total}".ljust(INTEGRITY_HEADER_SIZE - 1) + "\n"
    return head.encode() + raw


def decode_integrity(data: bytes, where: str = "integrity object") -> Tuple[Dict[ItemKey, int], Dict[str, Any]]:
    """The {(object, offset, length): crc32c} map and the body of an
    integrity object; where (its URL) names it in errors."""
    head = data[:INTEGRITY_HEADER_SIZE].decode("ascii", "replace")
    fields = head.split()
    if not head.startswith("ckptkit-dcp-integrity/1 ") or len(fields) < 2 or not fields[1].isdigit() \
            or len(data) != int(fields[1]):
        raise ckptkit.BadCheckpointError(f"{where}: malformed integrity object (header {head.strip()!r})")
    body = json.loads(data[INTEGRITY_HEADER_SIZE:])
    if body.get("algorithm") != "crc32c":
        raise ckptkit.BadCheckpointError(f"{where}: algorithm {body.get('algorithm')!r}, want crc32c")
    return {(i["object"], i["offset"], i["length"]): i["crc32c"] for i in body["items"]}, body


@dataclasses.dataclass
class _StoredItem:
    """What write_data reports per item (gathered on the coordinator)."""

    relative_path: str
    offset: int
    length: int
    crc32c: int
    save_id: Optional[str] = None


@dataclasses.dataclass
class _SavePrefix:
    """A rank's plan storage_data: its data file prefix and the save id the
    coordinator chose for this save (the objects' tag comes from it)."""

    prefix: str
    save_id: str


class StorageWriter(_TorchStorageWriter):
    """A DCP StorageWriter writing to a ckptkit URL.

    ``dcp.save(sd, storage_writer=StorageWriter("s3://b/run/step-00000100"))``

    Options: ``part_size`` (bytes of items per data object, default 64 MiB;
    an item larger than that gets an object of its own), ``concurrency``
    (uploads or deletes in flight per rank, default 4), ``overwrite`` (replace a
    committed checkpoint: its ``.metadata`` is deleted before any data of
    this save is written, so an interrupted overwrite leaves no committed
    checkpoint, and the objects only it referenced are deleted once this
    save is committed; default False fails with ConflictError),
    ``optimizer`` (the training-state record's optimizer part written to the
    integrity object: "saved", "omitted" or None), ``census`` (the saved
    optimizer state's census for the integrity object: a mapping of each
    parameter FQN to its slot names, or None for a parameter without saved
    state, or the members params/slot_sets/param_slots; see census_members;
    ckptkit.torch.save passes it; without it none is written and readers
    judge partial state by the subset rule). Every object of a save is
    named for it (``__<rank>_<n>.<tag>.distcp``, ``.ckptkit-integrity.<tag>``):
    of two saves racing to one URL, one commits and the other fails with
    ConflictError and deletes what it wrote. Memory beyond torch's own
    tensors: tensor bytes are uploaded straight from the tensors (a view of a
    larger storage is cloned first, as FileSystemWriter does); only the
    torch.save headers and bytes items are copied, into (concurrency + 1)
    reusable buffers. A tensor stays referenced until its part is uploaded,
    and write_data returns only when every part is.
    """

    # torch's AsyncStager protocol (torch.distributed.checkpoint.staging),
    # for dcp.async_save: stage() below. Staging blocks, so async_save need
    # not synchronize after starting the save.
    _synchronize_after_execute = False

    def __init__(self, url: CheckpointID, *, part_size: int = DEFAULT_PART_SIZE,
                 concurrency: int = DEFAULT_CONCURRENCY, overwrite: bool = False, optimizer: Optional[str] = None,
                 census: Optional[Census] = None) -> None:
        super().__init__()
        # Checked and normalized now: a bad census fails before any write.
        self.census = None if census is None else census_members(census)
        self.url = _url_of(url)
        self.part_size = int(part_size)
        self.concurrency = max(1, int(concurrency))
        self.overwrite = overwrite
        self.optimizer = optimizer
        self.save_id = str(uuid.uuid4())
        self.is_coordinator = False
        self._store: Optional[ckptkit.Store] = None
        self._staged: Optional[Dict[str, Any]] = None  # the copy stage() made, reused by the next stage()
        self._busy = threading.Lock()  # held from stage() to the end of finish()
        self._previous: Dict[str, Set[str]] = {}  # save id -> keys of the checkpoint an overwrite replaces

    # -- pickling ------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The writer's configuration and save state, without what lives in
        this process only (the open store, the kept staging copy, the lock):
        torch's AsyncCheckpointerType.PROCESS pickles the writer into its
        checkpoint process, which re-opens the store on first use."""
        state = self.__dict__.copy()
        state["_store"] = None
        state["_staged"] = None
        del state["_busy"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._busy = threading.Lock()

    # -- torch.distributed.checkpoint.staging.AsyncStager --------------------

    @property
    def should_synchronize_after_execute(self) -> bool:
        """False: stage() returns once the copy is complete."""
        return self._synchronize_after_execute

    def stage(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """The copy dcp.async_save writes in the background: every tensor,
        CPU ones included, copied into host memory (torch 2.6's default
        staging only moves tensors to the CPU, which leaves a CPU tensor
        uncopied, so the next training step changes what is being
        written). The copy holds the whole state; this writer keeps it and
        reuses it for its next async_save once the save using it has written
        its data, so a writer reused from save to save holds one state's
        size of staging memory (two while saves overlap), allocated once."""
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        reuse = self._busy.acquire(blocking=False)
        if reuse and (self._staged is None or not _same_layout(self._staged, state_dict)):
            self._staged = None
            self._staged = _create_cpu_state_dict(state_dict)
        try:
            staged = self._staged
            if not reuse or staged is None:
                # The previous save still reads the kept copy: a fresh one.
                return _copy_state_dict(state_dict, _create_cpu_state_dict(state_dict), type_check=False)
            return _copy_state_dict(state_dict, staged, type_check=False)
        except BaseException:
            if reuse:
                self._busy.release()
            raise

    def synchronize_staging(self) -> None:
        """Nothing to wait for: stage() returns once the copy is done."""

    def _staged_written(self) -> None:
        """The data is written: the kept copy may be reused."""
        if self._busy.locked():
            try:
                self._busy.release()
            except RuntimeError:
                pass

    # -- torch.distributed.checkpoint.StorageWriter --------------------------

    def reset(self, checkpoint_id: Optional[CheckpointID] = None) -> None:
        if checkpoint_id:
            self.url = _url_of(checkpoint_id)
            self._close()
        self.save_id = str(uuid.uuid4())

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointID) -> bool:
        return isinstance(checkpoint_id, str) and "://" in checkpoint_id

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self._open()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        st = self._open()
        if st.exists(METADATA_KEY) and not self.overwrite:
            raise ConflictError(f"a committed checkpoint already exists at {st.object_url(METADATA_KEY)} (overwrite=False)")
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # The coordinator, once per save, after every rank's local plan and
        # before any rank writes: a fresh save id names every object of
        # this save, on every rank.
        save_id = str(uuid.uuid4())
        self.save_id = save_id
        if self.overwrite:
            st = self._open()
            # What the old checkpoint references (removed once this save is
            # committed), then the old checkpoint stops being committed:
            # before the first byte of this save lands, so an interrupted
            # overwrite leaves no committed checkpoint, never a mixed one.
            self._previous[save_id] = self._committed_objects(st)
            st.delete(METADATA_KEY)
        return [dataclasses.replace(p, storage_data=_SavePrefix(f"__{i}_", save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        st = self._open()
        sp: _SavePrefix = plan.storage_data
        tag = save_tag(sp.save_id)
        suffix = f".{tag}.distcp" if tag else ".distcp"
        # Bytes items first (small), then tensors, like FileSystemWriter.
        items = [wi for wi in plan.items if wi.type == WriteItemType.BYTE_IO]
        items += [wi for wi in plan.items if wi.type != WriteItemType.BYTE_IO]
        results: List[WriteResult] = []
        lock = threading.Lock()
        # concurrency parts uploading plus one being filled, reused. A part
        # copies only the small writes (headers, bytes items); tensor bytes
        # are uploaded from the tensors themselves.
        free: "queue.Queue[_Part]" = queue.Queue()
        for _ in range(self.concurrency + 1):
            free.put(_Part(1 << 20))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ckptkit-put")
        futures: List["concurrent.futures.Future[None]"] = []
        scope = _lib.CancelScope()

        def upload(name: str, part: _Part) -> None:
            try:
                bufs, groups = part.body()
                _, crcs = st.put(name, bufs, groups=groups, scope=scope)
                out = [WriteResult(index=wi.index, size_in_bytes=n, storage_data=_StoredItem(name, off, n, crcs[g], sp.save_id))
                       for (wi, off, n), g in zip(part.items, part.item_groups)]
                del bufs
                with lock:
                    results.extend(out)
            finally:
                part.reset()
                free.put(part)

        count = 0
        part: Optional[_Part] = None
        try:
            # Waits in slices (_lib.queue_get, _lib.wait_all): Ctrl-C is
            # raised promptly whichever thread the signal lands on.
            for wi in items:
                if part is None:
                    part = _lib.queue_get(free)
                if part.size and part.size + _estimate(wi) > self.part_size:
                    futures.append(pool.submit(upload, f"{sp.prefix}{count}{suffix}", part))
                    count += 1
                    part = _lib.queue_get(free)
                _serialize_into(planner, wi, part)
            if part is not None and part.items:
                futures.append(pool.submit(upload, f"{sp.prefix}{count}{suffix}", part))
            _lib.wait_all(futures, scope)
        except BaseException:
            # Ctrl-C (or a failed upload): stop the uploads in flight
            # before waiting for the pool; nothing is committed.
            _lib.cancel_all(futures, scope)
            raise
        finally:
            pool.shutdown(wait=True)
            scope.close()
            self._staged_written()
        fut: "Future[List[WriteResult]]" = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        st = self._open()
        storage_md: Dict[MetadataIndex, _StorageInfo] = {}
        items: List[Dict[str, Any]] = []
        save_id = self.save_id
        for wr_list in results:
            for wr in wr_list:
                s = wr.storage_data
                save_id = s.save_id or save_id
                storage_md[wr.index] = _StorageInfo(s.relative_path, s.offset, s.length)
                items.append({"object": s.relative_path, "offset": s.offset, "length": s.length, "crc32c": s.crc32c})
        items.sort(key=lambda i: (i["object"], i["offset"]))
        metadata.storage_data = storage_md
        metadata.storage_meta = StorageMeta(checkpoint_id=self.url, save_id=save_id)
        previous = self._previous.pop(save_id, set())
        ikey = integrity_key(save_id)
        own = {i["object"] for i in items} | {ikey}
        # The integrity object first; the metadata last: the commit point.
        st.put(ikey, encode_integrity(items, self.optimizer, self.census))
        data = pickle.dumps(metadata)
        try:
            try:
                st.put(METADATA_KEY, data, if_absent=True)
            except UnsupportedError:
                # No atomic create-if-absent on this backend: checked in
                # prepare_local_plan, written plainly.
                st.put(METADATA_KEY, data)
        except ConflictError:
            # Another save committed first (Store.put tells a retried write
            # of our own bytes apart): what this save wrote is nobody's.
            self._remove(st, own, "of a save that lost the commit to another")
            raise
        # Committed: the objects only the replaced checkpoint referenced go.
        self._remove(st, previous - own, "of the checkpoint this save replaced")

    def _committed_objects(self, st: ckptkit.Store) -> Set[str]:
        """The keys the checkpoint committed at this URL references (data
        files and integrity object), read through the Go core's restricted
        unpickler; an empty set when there is none or it cannot be read
        (logged: its objects then stay)."""
        if not st.exists(METADATA_KEY):
            return set()
        try:
            ck = Checkpoint(self.url)
        except ckptkit.CheckpointError as e:
            log.warning("overwrite %s: the replaced checkpoint cannot be read (%s); its objects are left in place", self.url, e)
            return set()
        try:
            if ck.none or ck.info.name or ck.info.format != "torch-dcp":
                return set()  # not a DCP checkpoint at this very prefix
            md = ck.torch_metadata()
            keys = {info.relative_path for info in md.storage_data.values()}
            return keys | {integrity_key(_save_id_of(md)), INTEGRITY_KEY}
        finally:
            ck.close()

    def _remove(self, st: ckptkit.Store, keys: Set[str], what: str) -> None:
        """Delete keys, concurrently, best effort: a failure is logged."""
        if not keys:
            return

        def rm(key: str) -> None:
            try:
                st.delete(key)
            except ckptkit.CheckpointError as e:
                log.warning("could not delete %s, an object %s: %s", st.object_url(key), what, e)

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ckptkit-delete") as ex:
            list(ex.map(rm, sorted(keys)))

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.url, save_id=self.save_id)

    # -- helpers -------------------------------------------------------------

    def _open(self) -> ckptkit.Store:
        if self._store is None:
            self._store = ckptkit.Store(self.url)
        return self._store

    def _close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def checkpoint_id(self) -> str:
        return self.url


class _Part:
    """One data object being filled, written into by torch.save like a file.
    Small writes (zip headers, data.pkl, bytes items) are copied into a
    reusable buffer; the write of a tensor's storage, which torch hands out
    as a view of the storage itself, is kept by address (the tensor is
    kept alive until the upload is done), so the bytes are not copied in
    Python at all. Each item's segments form one CRC group.

    Every item starts at a multiple of ITEM_ALIGN bytes in the object (zero
    padding in a group of its own before it, in no item's range): torch.save
    aligns a tensor's storage record to 64 bytes within its archive, so the
    storage bytes then sit at the same offset modulo 64 in the file as in a
    tensor's memory (64-byte aligned), and the kernel's copies between the
    page cache and the tensor run at full speed in both directions
    (misaligned, they were about 30% slower here; docs/PERFORMANCE.md)."""

    _ZERO_COPY_MIN = 64 << 10

    def __init__(self, cap: int) -> None:
        self.buf = bytearray(cap)
        self.reset()

    def reset(self) -> None:
        self.pos = 0  # fill of buf
        self.size = 0  # bytes of the object so far
        self.items: List[Tuple[WriteItem, int, int]] = []  # (write item, offset, length)
        self.item_groups: List[int] = []  # each item's CRC group
        self.group = -1  # the group being written
        # [group, "buf", start, end] or [group, "raw", addr, n]
        self.segments: List[List[Any]] = []
        self.keep: List[torch.Tensor] = []
        self.lo = self.hi = 0
        self.item_start = 0

    def begin(self, tensor: Optional[torch.Tensor] = None) -> None:
        """Start the next item; tensor is the one torch.save is about to write."""
        pad = -self.size % ITEM_ALIGN
        if pad:  # under _ZERO_COPY_MIN: always copied into buf
            self.group += 1
            self.write(bytes(pad))
        self.group += 1
        self.item_groups.append(self.group)
        self.item_start = self.size
        if tensor is not None:
            st = tensor.untyped_storage()
            self.lo, self.hi = st.data_ptr(), st.data_ptr() + st.nbytes()
            self.keep.append(tensor)
        else:
            self.lo = self.hi = 0

    def end(self, wi: WriteItem) -> None:
        self.items.append((wi, self.item_start, self.size - self.item_start))

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = mv.nbytes
        group = self.group
        if n >= self._ZERO_COPY_MIN and self.hi:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # frombuffer warns about read-only views
                addr = torch.frombuffer(mv, dtype=torch.uint8).data_ptr()
            if self.lo <= addr and addr + n <= self.hi:
                self.segments.append([group, "raw", addr, n])
                self.size += n
                return n
        end = self.pos + n
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[self.pos : end] = mv
        last = self.segments[-1] if self.segments else None
        if last and last[0] == group and last[1] == "buf" and last[3] == self.pos:
            last[3] = end
        else:
            self.segments.append([group, "buf", self.pos, end])
        self.pos = end
        self.size += n
        return n

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def body(self) -> Tuple[List[Any], List[int]]:
        """(buffers, groups) for Store.put: each item one group."""
        whole = memoryview(self.buf)
        bufs: List[Any] = []
        groups: List[int] = []
        for item, kind, a, b in self.segments:
            bufs.append(whole[a:b] if kind == "buf" else ckptkit.RawBuffer(a, b))
            groups.append(item)
        return bufs, groups


def _same_layout(staged: Any, state_dict: Any) -> bool:
    """Whether the staged copy has state_dict's keys and tensor shapes and
    dtypes (so it can take the next copy)."""
    if type(staged) is not type(state_dict) and not (isinstance(staged, dict) and isinstance(state_dict, dict)):
        return False
    if isinstance(state_dict, dict):
        return staged.keys() == state_dict.keys() and all(_same_layout(staged[k], state_dict[k]) for k in state_dict)
    if isinstance(state_dict, (list, tuple)):
        return len(staged) == len(state_dict) and all(_same_layout(a, b) for a, b in zip(staged, state_dict))
    if isinstance(state_dict, torch.Tensor):
        return (isinstance(staged, torch.Tensor) and staged.shape == state_dict.shape and staged.dtype == state_dict.dtype
                and staged.stride() == state_dict.stride())
    return True


def _estimate(wi: WriteItem) -> int:
    """An item's serialized size, about (torch.save adds < 1 KiB)."""
    if wi.type == WriteItemType.BYTE_IO or wi.tensor_data is None:
        return 4096
    n = 1
    for d in wi.tensor_data.size:
        n *= d
    return n * wi.tensor_data.properties.dtype.itemsize + 1024


def _serialize_into(planner: SavePlanner, wi: WriteItem, part: _Part) -> None:
    """Append one item's stored bytes to part: the BytesIO of a bytes item,
    or torch.save of a tensor (its own storage only, like FileSystemWriter)."""
    data = planner.resolve_data(wi)
    if wi.type == WriteItemType.BYTE_IO:
        if not isinstance(data, io.BytesIO):
            raise TypeError(f"{wi.index.fqn}: the planner resolved a bytes item to {type(data).__name__}")
        part.begin()
        part.write(data.getbuffer())
        part.end(wi)
        return
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{wi.index.fqn}: the planner resolved a tensor item to {type(data).__name__}")
    t = data.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    part.begin(t)
    # torch.save writes a file-like object through write, flush and tell.
    torch.save(t, cast(IO[bytes], part))
    part.end(wi)


#: A read-in-place candidate: (object, offset, length, request, target).
_Candidate = Tuple[str, int, int, ReadItem, torch.Tensor]
#: A coalesced read: [object, start, end, [(offset, length, request), ...]].
_Read = List[Any]


class StorageReader(_TorchStorageReader):
    """A DCP StorageReader reading from a ckptkit URL (or an open
    :class:`Checkpoint`, whose metadata it then does not read again).

    ``dcp.load(sd, storage_reader=StorageReader("gs://b/run/step-00000100"))``

    It reads ``.metadata`` once per load, checks every item against the
    integrity object's CRC32C when the checkpoint has one (those written by
    torch itself have none), and reads data in coalesced ranged reads of at
    most ``max_read`` bytes, ``concurrency`` at a time.
    """

    def __init__(self, url: Union[CheckpointID, "Checkpoint"], *, concurrency: int = DEFAULT_CONCURRENCY,
                 max_read: int = DEFAULT_MAX_READ, in_place_min: int = DEFAULT_IN_PLACE_MIN) -> None:
        super().__init__()
        self._given = url if isinstance(url, Checkpoint) else None
        self.url = url.url if isinstance(url, Checkpoint) else _url_of(url)
        self.concurrency = max(1, int(concurrency))
        self.max_read = int(max_read)
        self.in_place_min = max(1, int(in_place_min))
        self.last_read_stats: Dict[str, Any] = {}
        self._ckpt = self._given
        self.storage_data: Dict[MetadataIndex, _StorageInfo] = {}
        self.crcs: Optional[CRCMap] = None
        self.load_id = str(uuid.uuid4())

    def reset(self, checkpoint_id: Optional[CheckpointID] = None) -> None:
        self.storage_data = {}
        if checkpoint_id and _url_of(checkpoint_id) != self.url:
            self.url = _url_of(checkpoint_id)
            self._given = None
            self._close()
        self.load_id = str(uuid.uuid4())

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointID) -> bool:
        return isinstance(checkpoint_id, str) and "://" in checkpoint_id

    def __getstate__(self) -> Dict[str, Any]:
        """The reader's configuration and load state, without the open
        checkpoint (a library handle of this process): the process that
        unpickles it opens the checkpoint at its URL on first use."""
        state = self.__dict__.copy()
        state["_given"] = None
        state["_ckpt"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            ck = self._checkpoint()
            md = ck.torch_metadata()
        except Exception as e:
            if _called_by_dcp_loader():
                # torch >= 2.10's loader catches this error and raises a bare
                # AssertionError("metadata is None; ...") in its place, so
                # the error (IncompleteError for an uncommitted checkpoint,
                # NotFoundError, ...) is deferred to set_up_storage_reader,
                # which the loader calls next with what this returns: it
                # raises this same exception there, and dcp.load's
                # CheckpointException carries it as the rank's failure,
                # on every torch version.
                return _FailedMetadata(e)
            raise
        sm = getattr(md, "storage_meta", None)
        if sm is None:
            sm = md.storage_meta = StorageMeta()
        sm.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if isinstance(metadata, _FailedMetadata):
            raise metadata.error
        self.storage_data = metadata.storage_data
        self.crcs = self._checkpoint().crcs()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        ck = self._checkpoint()
        t0 = time.perf_counter()
        stats: Dict[str, Any] = {"in_place_items": 0, "in_place_bytes": 0, "buffered_items": 0,
                                        "buffered_bytes": 0, "around_bytes": 0, "calls": 0, "seconds": {}}
        # Tensors whose stored bytes can land in their target as they are
        # (a whole stored chunk, target contiguous on the CPU, same dtype
        # and shape) are read straight into it; the rest (bytes items,
        # small or resharded chunks, other layouts) through a read buffer.
        self.last_read_stats = stats
        resolved: Dict[int, torch.Tensor] = {}  # id(req) -> the target resolve_tensor gave
        rest: List[ReadItem] = []
        cands: List[_Candidate] = []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO or info.length < self.in_place_min \
                    or any(req.storage_offsets):
                rest.append(req)
                continue
            dst = planner.resolve_tensor(req).detach()
            resolved[id(req)] = dst
            if dst.device.type != "cpu" or not dst.is_contiguous() or tuple(dst.shape) != tuple(req.lengths):
                rest.append(req)
                continue
            cands.append((info.relative_path, info.offset, info.length, req, dst))
        # Ctrl-C (or any failure) cancels the reads in flight, of either
        # path, before the read threads are waited for.
        with _lib.CancelScope() as scope:
            if cands:
                rest += self._read_in_place(ck, cands, planner, stats, scope)
            t1 = time.perf_counter()
            if rest:
                self._read_buffered(ck, rest, planner, resolved, stats, scope)
        stats["seconds"].update(plan=t1 - t0 - sum(stats["seconds"].values()), buffered=time.perf_counter() - t1)

        fut: "Future[None]" = Future()
        fut.set_result(None)
        return fut

    def _read_in_place(self, ck: "Checkpoint", cands: List[_Candidate], planner: LoadPlanner, stats: Dict[str, Any],
                       scope: CancelScope) -> List[ReadItem]:
        """Read the candidates (path, offset, length, req, target) straight
        into their targets, in two batched calls: the first HEAD_BYTES of
        each item (where its storage record begins), then each item whole,
        its storage bytes into the target and the bytes around them into a
        scratch buffer, its CRC32C computed as they land. Returns the reqs
        that must be read through a buffer instead (another layout). The
        head is read twice (4 KiB per item of at least in_place_min): the
        whole read's CRC32C then covers every byte in one Go-computed pass,
        at one more ranged request per item, batched in one call."""
        t0 = time.perf_counter()
        cands.sort(key=lambda c: (c[0], c[1]))
        heads = bytearray(HEAD_BYTES * len(cands))
        hv = memoryview(heads)
        base = _addr(heads)
        ck.read_items([(p, off, [(base + i * HEAD_BYTES, min(ln, HEAD_BYTES))]) for i, (p, off, ln, _, _) in enumerate(cands)],
                      self.concurrency, check=False, keys=[c[3].storage_index.fqn for c in cands], scope=scope)
        stats["calls"] += 1
        t1 = time.perf_counter()
        rest, go = [], []
        for i, (path, off, ln, req, dst) in enumerate(cands):
            loc = locate_storage(hv[i * HEAD_BYTES : i * HEAD_BYTES + min(ln, HEAD_BYTES)])
            if loc is None or loc.end > ln or loc.dtype != dst.dtype or tuple(loc.size) != tuple(dst.shape):
                rest.append(req)
                continue
            go.append((path, off, ln, req, dst, loc))
        del hv, heads
        if not go:
            return rest
        around = sum(loc.start + ln - loc.end for _, _, ln, _, _, loc in go)
        scratch = bytearray(around)
        sv = memoryview(scratch)
        sbase = _addr(scratch) if around else 0
        items, spans, pos = [], [], 0
        for path, off, ln, req, dst, loc in go:
            head, tail = (pos, pos + loc.start), (pos + loc.start, pos + loc.start + ln - loc.end)
            pos = tail[1]
            segs = [(sbase + head[0], loc.start), (dst.data_ptr(), loc.end - loc.start)]
            if tail[1] > tail[0]:
                segs.append((sbase + tail[0], tail[1] - tail[0]))
            items.append((path, off, segs))
            spans.append((head, tail))
        check = self.crcs is not None
        t2 = time.perf_counter()
        crcs = ck.read_items(items, self.concurrency, check=check,
                             keys=[req.storage_index.fqn for _, _, _, req, _, _ in go], scope=scope)
        stats["calls"] += 1
        stats["around_bytes"] += around
        t3 = time.perf_counter()
        for k, ((path, off, ln, req, dst, loc), (head, tail)) in enumerate(zip(go, spans)):
            if crcs is not None:
                self._check_crc(ck, req, path, off, ln, crcs[k])
            if not loc.confirm(sv[head[0]:head[1]], sv[tail[0]:tail[1]], ln):
                rest.append(req)  # not the layout the head promised: read whole
                continue
            planner.commit_tensor(req, dst)
            stats["in_place_items"] += 1
            stats["in_place_bytes"] += loc.end - loc.start
        stats["seconds"].update(heads=t1 - t0, locate=t2 - t1, read=t3 - t2, confirm=time.perf_counter() - t3)
        return rest

    def _check_crc(self, ck: "Checkpoint", req: ReadItem, path: str, off: int, ln: int, got: int) -> None:
        """Raise ChecksumError, naming key, object and offset, unless got is
        the CRC32C the integrity object records for the item."""
        want = self.crcs.get((path, off, ln)) if self.crcs is not None else None
        if want is None or got != want:
            raise ChecksumError(
                f"checksum mismatch: key {req.storage_index.fqn!r} in object {ck.object_url(path)} at offset {off} "
                f"({ln} bytes): stored CRC32C {'none' if want is None else format(want, '08x')}, computed {got:08x}",
                rule="checksum")

    def _read_buffered(self, ck: "Checkpoint", reqs: List[ReadItem], planner: LoadPlanner,
                       resolved: Dict[int, torch.Tensor], stats: Dict[str, Any], scope: CancelScope) -> None:
        """Read reqs in coalesced ranged reads into reusable buffers, check
        each item and copy it into its target (or hand a bytes item to the
        planner). resolved holds the targets already resolved."""
        per_file: Dict[str, List[Tuple[int, int, ReadItem]]] = {}
        for req in reqs:
            info = self.storage_data[req.storage_index]
            per_file.setdefault(info.relative_path, []).append((info.offset, info.length, req))
        # Coalesce item ranges that overlap or lie at most COALESCE_GAP
        # bytes apart (StorageWriter's alignment padding, for one) into reads
        # of at most max_read bytes (one item larger than that is one read).
        reads: List[_Read] = []
        for path, items in per_file.items():
            items.sort(key=lambda r: r[0])
            cur: Optional[_Read] = None
            for off, ln, req in items:
                if cur and off <= cur[2] + COALESCE_GAP and max(cur[2], off + ln) - cur[1] <= self.max_read:
                    cur[2] = max(cur[2], off + ln)
                    cur[3].append((off, ln, req))
                else:
                    cur = [path, off, off + ln, [(off, ln, req)]]
                    reads.append(cur)
        largest = max(r[2] - r[1] for r in reads)
        lock = threading.Lock()
        local = threading.local()

        def run(r: _Read) -> None:
            path, start, end, reqs = r
            # One reusable read buffer per thread (uninitialised memory, so
            # no page is zeroed or faulted in twice); every view of it is
            # copied into its destination before the next read.
            n = end - start
            backing = getattr(local, "buf", None)
            if backing is None or backing.numel() < n:
                backing = local.buf = torch.empty(max(n, min(largest, self.max_read)), dtype=torch.uint8)
            mv = memoryview((ctypes.c_char * n).from_address(backing.data_ptr())).cast("B") if n else memoryview(bytearray())
            # Items that follow each other without overlapping are read as
            # segments whose CRC32Cs the Go core computes as the bytes land;
            # overlapping ones (never written by a DCP planner) are checked
            # after the read.
            got_crcs: Dict[Tuple[int, int], int] = {}
            seg_lens: List[int] = []
            seg_items: List[Optional[Tuple[int, int]]] = []
            pos = start
            overlapping = False
            for off, ln, req in reqs:
                if off < pos:
                    overlapping = True
                    break
                if off > pos:
                    seg_lens.append(off - pos)
                    seg_items.append(None)
                seg_lens.append(ln)
                seg_items.append((off, ln))
                pos = off + ln
            if not overlapping and self.crcs is not None:
                if pos < end:
                    seg_lens.append(end - pos)
                    seg_items.append(None)
                for item_key, crc in zip(seg_items, ck.read_segments(path, start, mv, seg_lens, scope=scope)):
                    if item_key is not None:
                        got_crcs[item_key] = crc
            else:
                ck.read_into(path, start, mv, scope=scope)
            with lock:
                stats["calls"] += 1
                stats["buffered_items"] += len(reqs)
                stats["buffered_bytes"] += n
            for off, ln, req in reqs:
                item = mv[off - start:off - start + ln]
                if self.crcs is not None:
                    self._check_crc(ck, req, path, off, ln,
                                    got_crcs[(off, ln)] if (off, ln) in got_crcs else ckptkit.crc32c(item))
                if req.type == LoadItemType.BYTE_IO:
                    # torch's planner unpickles it with a general unpickler
                    # (torch.load(weights_only=False)): it gets only an item
                    # the restricted unpickler, with the Go reader's
                    # allow-list, read to its end.
                    _check_bytes_item(item, req.storage_index.fqn, ck.object_url(path), off)
                    with lock:
                        planner.load_bytes(req, io.BytesIO(item))
                    continue
                # A view of the read buffer when the archive is the plain
                # layout (no copy); torch.load otherwise.
                t = view_tensor(item)
                if t is None:
                    t = torch.load(io.BytesIO(item), map_location="cpu", weights_only=True)
                t = _narrow(t, req.storage_offsets, req.lengths)
                with lock:
                    dst = resolved.get(id(req))
                    if dst is None:
                        dst = planner.resolve_tensor(req).detach()
                if dst.size() != t.size():
                    raise ckptkit.MismatchError(f"{req.storage_index.fqn}: stored chunk {tuple(t.size())}, target {tuple(dst.size())}")
                dst.copy_(t)
                with lock:
                    planner.commit_tensor(req, dst)

        if len(reads) <= 1 or self.concurrency == 1:
            for r in reads:
                run(r)
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ckptkit-read") as ex:
                # Waited for in slices, cancelled together (_lib.wait_all).
                _lib.wait_all([ex.submit(run, r) for r in reads], scope)

    @property
    def checkpoint_id(self) -> str:
        return self.url

    def _checkpoint(self) -> "Checkpoint":
        if self._ckpt is None:
            self._ckpt = Checkpoint(self.url)
        return self._ckpt

    def _close(self) -> None:
        if self._ckpt is not None and self._ckpt is not self._given:
            self._ckpt.close()
        self._ckpt = None


def _check_bytes_item(item: memoryview, key: str, object_url: str, offset: int) -> None:
    """Raise BadCheckpointError, naming key and the global or the problem,
    unless the bytes item reads with the restricted unpickler (_restricted)."""
    try:
        check_item(item)
    except ForbiddenGlobalError as e:
        raise ckptkit.BadCheckpointError(
            f"bytes item {key!r} in object {object_url} at offset {offset}: {e}; it is not handed to torch's planner, "
            "which would unpickle it with a general unpickler") from None
    except (pickle.UnpicklingError, RecursionError, MemoryError) as e:
        raise ckptkit.BadCheckpointError(
            f"bytes item {key!r} in object {object_url} at offset {offset} is not a pickle ckptkit's restricted "
            f"unpickler reads: {e}") from None


class _FailedMetadata(Metadata):
    """What StorageReader.read_metadata returns to torch's DCP loader when
    reading the metadata failed: no state at all, and the error, which
    set_up_storage_reader raises."""

    def __init__(self, error: Exception) -> None:
        super().__init__(state_dict_metadata={})
        self.error = error


def _called_by_dcp_loader() -> bool:
    """Whether StorageReader.read_metadata's caller is torch's DCP loader
    (torch.distributed.checkpoint.state_dict_loader), which calls
    set_up_storage_reader with the metadata before anything else of the
    storage reader."""
    f = sys._getframe(2)
    return f is not None and f.f_globals.get("__name__") == "torch.distributed.checkpoint.state_dict_loader"


def _addr(buf: bytearray) -> int:
    """The address of a bytearray's first byte (kept alive by the caller)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _narrow(t: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    for dim, (off, ln) in enumerate(zip(offsets, lengths)):
        if off != 0 or ln != t.size(dim):
            t = t.narrow(dim, off, ln)
    return t


class Checkpoint(_lib.Closing):
    """An open checkpoint (through the Go core): the checkpoint at url, or the
    newest committed valid checkpoint of the run at url. Its metadata is read
    once, at open; ``info`` says which checkpoint it is (``none`` True when a
    run has no committed checkpoint)."""

    def __init__(self, url: CheckpointID) -> None:
        self._h = 0
        self._close_lock = threading.Lock()
        h = ctypes.c_size_t(0)
        info = ctypes.c_void_p()
        _lib.call("ckpt_checkpoint_open", _url_of(url).encode(), _lib.environment(), ctypes.byref(h), ctypes.byref(info))
        self._h = h.value
        self.info = CheckpointInfo.from_json(_lib.take_string(info.value))
        self.url = self.info.url
        self._md: Optional[Metadata] = None
        self._crcs_read = False
        self._crcs: Optional[CRCMap] = None
        self._store = ckptkit.Store._from_handle(h.value, self.url)
        self._lent_handle = False
        #: Whether the last load() failed.
        self.load_failed = False
        #: Whether a resume that lent it loads it in one pass (it may load
        #: another checkpoint after this one).
        self.one_pass = False

    @classmethod
    def _lent(cls, handle: int, info: LoadInfo) -> "Checkpoint":
        """The checkpoint a resume of the Go core lends its load callback
        (ckpt_run_resume): valid during the callback; close() only forgets
        the handle (the resume owns it)."""
        ck = cls.__new__(cls)
        ck._h = handle
        ck._close_lock = threading.Lock()
        ck.info = CheckpointInfo(url=info.url, name=info.name, step=info.step, format=info.format,
                                 iteration=info.iteration, optimizer=info.optimizer, skipped=(), none=False,
                                 empty=False)
        ck.url = info.url
        ck._md = None
        ck._crcs_read = False
        ck._crcs = None
        ck._store = ckptkit.Store._from_handle(handle, ck.url)
        ck._lent_handle = True
        ck.load_failed = False
        ck.one_pass = info.one_pass
        return ck

    @property
    def none(self) -> bool:
        """True when the run holds no committed checkpoint."""
        return self.info.none

    def raw_metadata(self) -> bytes:
        """The metadata object's bytes, as read at open."""
        out = ctypes.c_void_p()
        n = ctypes.c_int64(0)
        _lib.call("ckpt_checkpoint_metadata", self._handle(), ctypes.byref(out), ctypes.byref(n))
        return _lib.take_bytes(out.value, n.value)

    def torch_metadata(self) -> Metadata:
        """The DCP Metadata, unpickled from the bytes read at open. The Go
        core has already decoded them with its restricted unpickler (only
        DCP classes and plain values); Python unpickles them with the same
        allow-list (_restricted.MetadataUnpickler), and any failure is a
        BadCheckpointError."""
        if self._md is None:
            if self.none:
                raise NotFoundError(f"{self.url}: no committed checkpoint is stored there (check the URL)")
            if self.info.format != "torch-dcp":
                raise UnsupportedError(f"{self.url} is a {self.info.format} checkpoint, not DCP")
            try:
                md = load_metadata(self.raw_metadata())
            except (pickle.UnpicklingError, ImportError, AttributeError, TypeError, ValueError, RuntimeError,
                    MemoryError, RecursionError, EOFError, KeyError, IndexError, dataclasses.FrozenInstanceError) as e:
                raise ckptkit.BadCheckpointError(
                    f"{self.url}: .metadata: Python cannot read it as the Go core did: {type(e).__name__}: {e}") from None
            if not isinstance(md, Metadata):
                raise ckptkit.BadCheckpointError(f"{self.url}: .metadata is not a DCP Metadata")
            self._md = md
        return self._md

    def keys(self) -> Set[str]:
        """The keys the checkpoint holds (tensors and byte values), from the
        metadata read at open: DCP's or ckptkit's native one (the format
        async saves write)."""
        if self.info.format == "torch-dcp":
            return set(self.torch_metadata().state_dict_metadata)
        md = json.loads(self.raw_metadata())
        return {e["key"] for e in (md.get("tensors") or []) + (md.get("bytes") or [])}

    def crcs(self) -> Optional[CRCMap]:
        """{(object, offset, length): crc32c} from the integrity object of the
        save that committed the metadata (integrity_key of its
        storage_meta.save_id, else the legacy fixed name, as the Go reader
        finds it), or None when the checkpoint has none (written by torch
        itself)."""
        if not self._crcs_read:
            self._crcs_read = True
            md = self.torch_metadata()
            keys = list(dict.fromkeys([integrity_key(_save_id_of(md)), INTEGRITY_KEY]))
            for key in keys:
                try:
                    data = self._store.read(key)
                except ckptkit.NotFoundError:
                    continue
                where = self.object_url(key)
                # In about the object's size (not json's dict per item).
                def by_json(d: bytes, where: str = where) -> Dict[ItemKey, int]:
                    return decode_integrity(d, where)[0]

                self._crcs = read_item_crcs(data, by_json)
                del data
                break
            tag = save_tag(_save_id_of(md))
            if self._crcs is None and tag and any(
                    str(getattr(s, "relative_path", "")).endswith(f".{tag}.distcp")
                    for s in (getattr(md, "storage_data", None) or {}).values()):
                # Named for the committing save: ckptkit wrote it, with an
                # integrity object, which is gone (as the Go reader says).
                raise ckptkit.BadCheckpointError(
                    f"{self.object_url(keys[0])}: integrity object missing: the data objects are named for save "
                    f"{tag}, which ckptkit writes with its CRC32Cs")
        return self._crcs

    def read_into(self, key: str, offset: int, buf: ckptkit.Buffer, *, scope: Optional[CancelScope] = None) -> int:
        """Read len(buf) bytes of data object key at offset into buf."""
        return self._store.read_into(key, offset, buf, scope=scope)

    def read_segments(self, key: str, offset: int, buf: ckptkit.Buffer, lengths: Sequence[int], *,
                      scope: Optional[CancelScope] = None) -> List[int]:
        """Read consecutive segments of data object key into buf and return
        their CRC32Cs (see Store.read_segments)."""
        return self._store.read_segments(key, offset, buf, lengths, scope=scope)

    def read_items(self, items: Sequence[Tuple[str, int, Sequence[Tuple[int, int]]]], concurrency: int,
                   check: bool = True, keys: Optional[Sequence[str]] = None, *,
                   scope: Optional[CancelScope] = None) -> Optional[List[int]]:
        """Read items, each (object key, offset, [(address, length), ...]):
        one ranged read of the segments' total length whose bytes land in
        the segments (C memory the caller keeps alive) in turn, up to
        concurrency items at once, in one call into the Go core (which
        releases the GIL). Returns each item's CRC32C, computed as its
        bytes land, or None when check is False (nothing hashed). keys
        (optional, one per item) name the item in an error."""
        n = len(items)
        if not n:
            return [] if check else None
        names = (ctypes.c_char_p * n)(*[k.encode() for k, _, _ in items])
        offsets = (ctypes.c_int64 * n)(*[off for _, off, _ in items])
        counts = (ctypes.c_int32 * n)(*[len(segs) for _, _, segs in items])
        flat = [seg for _, _, segs in items for seg in segs]
        lens = (ctypes.c_int64 * max(1, len(flat)))(*[ln for _, ln in flat])
        ptrs = (ctypes.c_void_p * max(1, len(flat)))(*[a for a, _ in flat])
        crcs = (ctypes.c_uint32 * n)() if check else None
        failed = ctypes.c_int(-1)
        try:
            _lib.call("ckpt_read_items", self._store._handle(), n, names, offsets, counts, lens, ptrs, crcs,
                      max(1, int(concurrency)), ctypes.byref(failed), scope=scope)
        except ckptkit.CheckpointError as e:
            if keys is not None and 0 <= failed.value < n:
                e.args = (f"key {keys[failed.value]!r}: {e.args[0]}",) + e.args[1:]
                e.message = e.args[0]
            raise
        return list(crcs) if crcs is not None else None

    def object_url(self, key: str = "") -> str:
        """The redacted URL of an object of the checkpoint."""
        return self._store.object_url(key)

    def load(self, spec: Mapping[str, Any], buffers: Sequence[Optional[int]], *,
             scope: Optional[CancelScope] = None) -> LoadReport:
        """Run the Go loader (every resume rule, every CRC, before any
        buffer changes unless spec's one_pass) on spec (see
        capi/checkpoint.go loadSpec) into the C buffers (addresses) listed
        in buffers; its report. ``load_failed`` says whether the last load
        failed."""
        n = len(buffers)
        arr = (ctypes.c_void_p * max(n, 1))(*buffers)
        out = ctypes.c_void_p()
        self.load_failed = True
        _lib.call("ckpt_checkpoint_load", self._handle(), json.dumps(spec).encode(), arr, n, ctypes.byref(out),
                  scope=scope)
        self.load_failed = False
        return LoadReport.from_json(_lib.take_string(out.value))

    def _handle(self) -> int:
        h = self._h
        if not h:
            raise ckptkit.UsageError(f"checkpoint {self.url} is closed")
        return h

    def close(self) -> None:
        """Release the checkpoint (idempotent, thread-safe): waits for the
        calls in flight on it; later calls raise UsageError."""
        with self._close_lock:
            h, self._h = self._h, 0
        if h:
            self._store._h = 0
            if not self._lent_handle:
                _lib.call("ckpt_checkpoint_close", h)

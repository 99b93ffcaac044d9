"""The JSON documents the C ABI returns, as frozen dataclasses.

Every document libckptkit hands back as JSON is read here and nowhere else,
by ``from_wire``: each class's ``WIRE`` maps its attributes to the field
names the Go side writes (capi/wire.go and the types it names, never a Go
struct field name), and ``testdata/abi_golden.json`` under capi/ holds one
document of each kind, checked on both sides (capi/wire_test.go,
python/tests/test_abi.py). A field that is missing or of the wrong type is
a :class:`~ckptkit.CheckpointError` naming it (the binding and the library
disagree), never a silent default. The only fields that may be absent are
those the Go side leaves out when they are empty (``omitempty``), listed in
``OMITTED`` with the value their absence means; a JSON ``null`` for a list is
Go's empty (nil) slice.

:class:`ObjectStat` is not JSON (``ckpt_stat`` fills out-parameters), but it
is what :meth:`ckptkit.Store.stat` returns, in the same form.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar, Union

from .errors import INTERNAL, CheckpointError

_T = TypeVar("_T")

_NOTHING: Mapping[str, Any] = MappingProxyType({})


def _names(*attrs: str, **renamed: str) -> Mapping[str, str]:
    """A WIRE mapping: attrs keep their names on the wire, renamed maps an
    attribute to its different wire name."""
    out = {a: a for a in attrs}
    out.update(renamed)
    return MappingProxyType(out)


class _Doc:
    """One JSON document being read into cls: typed field access by
    attribute name (looked up under its WIRE name), failing clearly."""

    def __init__(self, doc: object, cls: Type[Any]) -> None:
        self.what = cls.__name__
        if not isinstance(doc, dict):
            raise _error(f"{self.what}: the library returned {type(doc).__name__}, not a JSON object")
        self.doc: Dict[str, Any] = doc
        self.wire: Mapping[str, str] = cls.WIRE
        self.omitted: Mapping[str, Any] = getattr(cls, "OMITTED", _NOTHING)

    def raw(self, attr: str) -> Any:
        name = self.wire[attr]
        if name in self.doc:
            return self.doc[name]
        if name in self.omitted:
            return self.omitted[name]
        raise _error(f"{self.what}: the library's JSON has no field {name!r} (it has {sorted(self.doc)})")

    def _typed(self, attr: str, typ: Tuple[type, ...], want: str) -> Any:
        v = self.raw(attr)
        if not isinstance(v, typ) or (isinstance(v, bool) and bool not in typ):
            raise _error(f"{self.what}: field {self.wire[attr]!r} is {type(v).__name__} {v!r}, want {want}")
        return v

    def text(self, attr: str) -> str:
        v: str = self._typed(attr, (str,), "a string")
        return v

    def integer(self, attr: str) -> int:
        v: int = self._typed(attr, (int,), "an integer")
        return v

    def number(self, attr: str) -> float:
        # Go writes an integral float64 without a fraction (1.0 as 1).
        return float(self._typed(attr, (int, float), "a number"))

    def flag(self, attr: str) -> bool:
        v: bool = self._typed(attr, (bool,), "a boolean")
        return v

    def items(self, attr: str) -> Tuple[Any, ...]:
        v = self.raw(attr)
        if v is None:  # a Go nil slice
            return ()
        if not isinstance(v, list):
            raise _error(f"{self.what}: field {self.wire[attr]!r} is {type(v).__name__}, want a list")
        return tuple(v)

    def texts(self, attr: str) -> Tuple[str, ...]:
        v = self.items(attr)
        if not all(isinstance(s, str) for s in v):
            raise _error(f"{self.what}: field {self.wire[attr]!r} holds a non-string: {v!r}")
        return v

    def docs(self, attr: str, cls: Type[_W]) -> Tuple[_W, ...]:
        return tuple(self._nested(attr, cls, d) for d in self.items(attr))

    def optional(self, attr: str, cls: Type[_W]) -> Optional[_W]:
        """A nested document, or None for JSON null."""
        v = self.raw(attr)
        return None if v is None else self._nested(attr, cls, v)

    def _nested(self, attr: str, cls: Type[_W], v: object) -> _W:
        try:
            return cls.from_wire(v)
        except CheckpointError as e:
            raise CheckpointError(f"{self.what}: field {self.wire[attr]!r}: {e.message}", cls=INTERNAL) from None


def _error(msg: str) -> CheckpointError:
    return CheckpointError(f"{msg}: libckptkit and this binding disagree on the C ABI's JSON (rebuild with "
                           "`make python`)", cls=INTERNAL)


class _Wire:
    """Base of the documents read from the C ABI."""

    #: attribute name -> field name on the wire.
    WIRE: ClassVar[Mapping[str, str]]
    #: wire field name -> the value its absence means (Go's omitempty).
    OMITTED: ClassVar[Mapping[str, Any]] = _NOTHING

    @classmethod
    def from_wire(cls: Type[_W], doc: object) -> _W:
        """The document doc (a decoded JSON object) as cls; a missing or
        mistyped field raises CheckpointError naming it."""
        raise NotImplementedError

    @classmethod
    def from_json(cls: Type[_W], text: Union[str, bytes]) -> _W:
        """from_wire of the JSON text the library returned."""
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise _error(f"{cls.__name__}: the library returned no JSON ({e}): {text[:200]!r}") from None
        return cls.from_wire(doc)


_W = TypeVar("_W", bound=_Wire)


@dataclass(frozen=True)
class ObjectInfo(_Wire):
    """One entry of :meth:`ckptkit.Store.list`: key (relative to the store),
    size in bytes, modification time in nanoseconds."""

    key: str
    size: int
    mtime_ns: int

    WIRE: ClassVar[Mapping[str, str]] = _names("key", "size", "mtime_ns")

    @classmethod
    def from_wire(cls, doc: object) -> ObjectInfo:
        d = _Doc(doc, cls)
        return cls(key=d.text("key"), size=d.integer("size"), mtime_ns=d.integer("mtime_ns"))


@dataclass(frozen=True)
class ObjectStat:
    """What :meth:`ckptkit.Store.stat` returns: size in bytes, modification
    time in nanoseconds, and the CRC32C the backend stored with the object
    (None when it has none). Filled from ckpt_stat's out-parameters."""

    size: int
    mtime_ns: int
    crc32c: Optional[int]


@dataclass(frozen=True)
class Capabilities(_Wire):
    """What a store's backend can do (:meth:`ckptkit.Store.capabilities`):
    atomic create-if-absent, server-side CRC32C checking, multipart
    uploads, their part size and concurrency."""

    create_if_absent: bool
    server_crc32c: bool
    multipart: bool
    part_size: int
    concurrency: int

    WIRE: ClassVar[Mapping[str, str]] = _names("create_if_absent", "server_crc32c", "multipart", "part_size",
                                               "concurrency")

    @classmethod
    def from_wire(cls, doc: object) -> Capabilities:
        d = _Doc(doc, cls)
        return cls(create_if_absent=d.flag("create_if_absent"), server_crc32c=d.flag("server_crc32c"),
                   multipart=d.flag("multipart"), part_size=d.integer("part_size"), concurrency=d.integer("concurrency"))


@dataclass(frozen=True)
class SkippedCheckpoint(_Wire):
    """A checkpoint passed over, with the reason (uncommitted, unreadable,
    damaged data, another rank's older choice)."""

    url: str
    reason: str

    WIRE: ClassVar[Mapping[str, str]] = _names("url", "reason")

    @classmethod
    def from_wire(cls, doc: object) -> SkippedCheckpoint:
        d = _Doc(doc, cls)
        return cls(url=d.text("url"), reason=d.text("reason"))


@dataclass(frozen=True)
class CheckpointInfo(_Wire):
    """Which checkpoint an open :class:`ckptkit.torch.Checkpoint` is: its
    URL (credentials redacted), its name under the run (step-<8 digits>,
    "" when the URL named the checkpoint itself), the step of its name (its
    iteration otherwise), format ("torch-dcp" or "native"), iteration,
    optimizer record, the newer checkpoints of the run skipped; ``none``
    when the run holds no committed checkpoint, ``empty`` (with none) when
    nothing at all is stored under the URL."""

    url: str
    name: str
    step: int
    format: str
    iteration: int
    optimizer: str
    skipped: Tuple[SkippedCheckpoint, ...]
    none: bool
    empty: bool

    WIRE: ClassVar[Mapping[str, str]] = _names("url", "name", "step", "format", "iteration", "optimizer", "skipped",
                                               "none", "empty")
    OMITTED: ClassVar[Mapping[str, Any]] = MappingProxyType({"name": "", "none": False, "empty": False})

    @classmethod
    def from_wire(cls, doc: object) -> CheckpointInfo:
        d = _Doc(doc, cls)
        return cls(url=d.text("url"), name=d.text("name"), step=d.integer("step"), format=d.text("format"),
                   iteration=d.integer("iteration"), optimizer=d.text("optimizer"),
                   skipped=d.docs("skipped", SkippedCheckpoint), none=d.flag("none"), empty=d.flag("empty"))


@dataclass(frozen=True)
class LoadReport(_Wire):
    """What :meth:`ckptkit.torch.Checkpoint.load` returns: the Go loader's
    figures (loader.Report), its one-line summary and the bytes values it
    loaded (``byte_values``: per target, key -> the stored bytes, or
    None)."""

    url: str
    format: str
    iteration: int
    optimizer_record: str
    optimizer_loaded: bool
    lazy_params: Tuple[str, ...]
    lazy_keys: int
    skipped_optimizer_keys: int
    frozen_missing: Tuple[str, ...]
    extra_keys: Tuple[str, ...]
    keys_loaded: int
    bytes_needed: int
    bytes_read: int
    read_requests: int
    mode: str
    seconds: float
    summary: str
    byte_values: Tuple[Mapping[str, Optional[bytes]], ...]

    WIRE: ClassVar[Mapping[str, str]] = _names(
        "url", "format", "iteration", "optimizer_record", "optimizer_loaded", "lazy_params", "lazy_keys",
        "skipped_optimizer_keys", "frozen_missing", "extra_keys", "keys_loaded", "bytes_needed", "bytes_read",
        "read_requests", "mode", "seconds", "summary", byte_values="bytes")

    @classmethod
    def from_wire(cls, doc: object) -> LoadReport:
        d = _Doc(doc, cls)
        values = []
        for per in d.items("byte_values"):
            if not isinstance(per, dict):
                raise _error(f"LoadReport: field 'bytes' holds {type(per).__name__}, want objects")
            values.append(MappingProxyType({k: _b64(k, v) for k, v in per.items()}))
        return cls(url=d.text("url"), format=d.text("format"), iteration=d.integer("iteration"),
                   optimizer_record=d.text("optimizer_record"), optimizer_loaded=d.flag("optimizer_loaded"),
                   lazy_params=d.texts("lazy_params"), lazy_keys=d.integer("lazy_keys"),
                   skipped_optimizer_keys=d.integer("skipped_optimizer_keys"), frozen_missing=d.texts("frozen_missing"),
                   extra_keys=d.texts("extra_keys"), keys_loaded=d.integer("keys_loaded"),
                   bytes_needed=d.integer("bytes_needed"), bytes_read=d.integer("bytes_read"),
                   read_requests=d.integer("read_requests"), mode=d.text("mode"), seconds=d.number("seconds"),
                   summary=d.text("summary"), byte_values=tuple(values))


def _b64(key: str, v: object) -> Optional[bytes]:
    """A bytes value of the load report (Go's []byte: base64, or null)."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise _error(f"LoadReport: bytes value {key!r} is {type(v).__name__}, want base64 text")
    try:
        return base64.b64decode(v, validate=True)
    except binascii.Error as e:
        raise _error(f"LoadReport: bytes value {key!r} is not base64 ({e})") from None


@dataclass(frozen=True)
class SaveResult(_Wire):
    """An asynchronous save's figures once committed
    (:attr:`ckptkit.torch.AsyncSave.result`): the checkpoint URL, bytes
    written (data and metadata), seconds from start to commit, how long
    save() blocked (``stall_seconds``: waiting for the previous save,
    planning, staging) and waited for the previous save
    (``waited_seconds``), how long the save read the caller's tensors
    (``staging_seconds``: planning and the copy into the pool, most of it
    after save() returned when it overlaps), and a warning ("" when none: a
    cleanup that failed after the commit)."""

    url: str
    bytes_written: int
    metadata_bytes: int
    seconds: float
    stall_seconds: float
    waited_seconds: float
    staging_seconds: float
    warning: str

    WIRE: ClassVar[Mapping[str, str]] = _names("url", "bytes_written", "metadata_bytes", "seconds", "stall_seconds",
                                               "waited_seconds", "staging_seconds", "warning")
    OMITTED: ClassVar[Mapping[str, Any]] = MappingProxyType({"warning": ""})

    @classmethod
    def from_wire(cls, doc: object) -> SaveResult:
        d = _Doc(doc, cls)
        return cls(url=d.text("url"), bytes_written=d.integer("bytes_written"), metadata_bytes=d.integer("metadata_bytes"),
                   seconds=d.number("seconds"), stall_seconds=d.number("stall_seconds"),
                   waited_seconds=d.number("waited_seconds"), staging_seconds=d.number("staging_seconds"),
                   warning=d.text("warning"))


@dataclass(frozen=True)
class SaverStats(_Wire):
    """An asynchronous saver's staging figures
    (:meth:`ckptkit.torch.AsyncSaver.stats`): its budget, the pool
    allocated, the bytes held now and the peak since it was created."""

    budget_bytes: int
    pool_bytes: int
    held_bytes: int
    peak_bytes: int

    WIRE: ClassVar[Mapping[str, str]] = _names("budget_bytes", "pool_bytes", "held_bytes", "peak_bytes")

    @classmethod
    def from_wire(cls, doc: object) -> SaverStats:
        d = _Doc(doc, cls)
        return cls(budget_bytes=d.integer("budget_bytes"), pool_bytes=d.integer("pool_bytes"), held_bytes=d.integer("held_bytes"),
                   peak_bytes=d.integer("peak_bytes"))


@dataclass(frozen=True)
class RunLayout(_Wire):
    """A run's layout as the Go core's package run owns it (ckpt_run_layout):
    a step's checkpoint name and URL under the run, and where ranks
    coordinating through the store keep their rounds."""

    step_name: str
    step_url: str
    coord_url: str

    WIRE: ClassVar[Mapping[str, str]] = _names("step_name", "step_url", "coord_url")

    @classmethod
    def from_wire(cls, doc: object) -> RunLayout:
        d = _Doc(doc, cls)
        return cls(step_name=d.text("step_name"), step_url=d.text("step_url"), coord_url=d.text("coord_url"))


@dataclass(frozen=True)
class LoadInfo(_Wire):
    """Which checkpoint a resume of the Go core (ckpt_run_resume) lends its
    load callback: as CheckpointInfo, and ``one_pass`` when the load is in
    one pass (the resume may load another checkpoint after this one)."""

    url: str
    name: str
    step: int
    format: str
    iteration: int
    optimizer: str
    one_pass: bool

    WIRE: ClassVar[Mapping[str, str]] = _names("url", "name", "step", "format", "iteration", "optimizer", "one_pass")

    @classmethod
    def from_wire(cls, doc: object) -> LoadInfo:
        d = _Doc(doc, cls)
        return cls(url=d.text("url"), name=d.text("name"), step=d.integer("step"), format=d.text("format"),
                   iteration=d.integer("iteration"), optimizer=d.text("optimizer"), one_pass=d.flag("one_pass"))


@dataclass(frozen=True)
class ResumeSkip(_Wire):
    """A checkpoint a resume passed over: its URL, the reason, and why
    (``uncommitted``, ``invalid``, ``damaged``, ``other-rank``,
    ``unreadable``)."""

    url: str
    reason: str
    why: str

    WIRE: ClassVar[Mapping[str, str]] = _names("url", "reason", "why")

    @classmethod
    def from_wire(cls, doc: object) -> ResumeSkip:
        d = _Doc(doc, cls)
        return cls(url=d.text("url"), reason=d.text("reason"), why=d.text("why"))


@dataclass(frozen=True)
class ResumeResult(_Wire):
    """What ckpt_run_resume returns: a fresh start (``fresh``; ``empty``
    when nothing at all is stored), or the checkpoint loaded (url, name,
    step, iteration), the ones passed over, and with a local tier which
    tier and why."""

    fresh: bool
    empty: bool
    url: str
    name: str
    step: int
    iteration: int
    skipped: Tuple[ResumeSkip, ...]
    tier: str
    tier_why: str

    WIRE: ClassVar[Mapping[str, str]] = _names("fresh", "empty", "url", "name", "step", "iteration", "skipped", "tier",
                                               "tier_why")

    @classmethod
    def from_wire(cls, doc: object) -> ResumeResult:
        d = _Doc(doc, cls)
        return cls(fresh=d.flag("fresh"), empty=d.flag("empty"), url=d.text("url"), name=d.text("name"),
                   step=d.integer("step"), iteration=d.integer("iteration"), skipped=d.docs("skipped", ResumeSkip),
                   tier=d.text("tier"), tier_why=d.text("tier_why"))


@dataclass(frozen=True)
class PersistOutcome(_Wire):
    """A background persist of a tiered run that ended: its step, retries,
    bytes copied, and its error ("" when it succeeded)."""

    step: int
    retries: int
    bytes: int
    error: str

    WIRE: ClassVar[Mapping[str, str]] = _names("step", "retries", "bytes", "error")
    OMITTED: ClassVar[Mapping[str, Any]] = MappingProxyType({"error": ""})

    @classmethod
    def from_wire(cls, doc: object) -> PersistOutcome:
        d = _Doc(doc, cls)
        return cls(step=d.integer("step"), retries=d.integer("retries"), bytes=d.integer("bytes"),
                   error=d.text("error"))


def list_from_json(cls: Type[_W], text: Union[str, bytes]) -> Tuple[_W, ...]:
    """A JSON list of cls documents, as the library returned it."""
    try:
        docs = json.loads(text)
    except ValueError as e:
        raise _error(f"{cls.__name__} list: the library returned no JSON ({e}): {text[:200]!r}") from None
    if not isinstance(docs, list):
        raise _error(f"{cls.__name__} list: the library returned {type(docs).__name__}, not a list")
    return tuple(cls.from_wire(d) for d in docs)


#: The documents of capi/testdata/abi_golden.json, by its keys.
GOLDEN: Mapping[str, Type[_Wire]] = MappingProxyType({
    "capabilities": Capabilities,
    "list_entry": ObjectInfo,
    "checkpoint_info": CheckpointInfo,
    "load_report": LoadReport,
    "save_result": SaveResult,
    "saver_stats": SaverStats,
    "run_layout": RunLayout,
    "load_info": LoadInfo,
    "resume_result": ResumeResult,
    "persist": PersistOutcome,
})


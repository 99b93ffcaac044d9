"""A fast path for the torch.save archives DCP stores one per item.

``view_tensor``: the tensor stored in a torch.save archive, as a view of
  the archive's bytes (no copy), found through the zip central directory
  and a restricted reading of ``data.pkl`` that only knows
  ``torch._utils._rebuild_tensor_v2`` and the storage classes. Anything
  else returns None, and the caller falls back to ``torch.load``.

``locate_storage`` / ``Located.confirm``: where the tensor's storage bytes
  lie inside an archive, from its first bytes alone (the local file headers
  up to the storage record), so a reader can read them straight into the
  target tensor; ``confirm`` then checks the bytes around them (the head
  again and the central directory at the end) once they are read.
"""

import collections
import io
import pickle
import struct
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch

#: A view of an archive's bytes (or the bytes themselves).
_Bytes = Union[bytes, memoryview]
#: A zip entry: (local header offset, size, method).
_Entry = Tuple[int, int, int]

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
}

class _Rebuilt:
    __slots__ = ("key", "dtype", "offset", "size", "stride")

    key: str
    dtype: torch.dtype
    offset: int
    size: Tuple[int, ...]
    stride: Tuple[int, ...]


class _Storage:
    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


def _rebuild_tensor_v2(storage: Tuple[str, torch.dtype], storage_offset: int, size: Sequence[int],
                       stride: Sequence[int], requires_grad: bool = False, backward_hooks: object = None,
                       metadata: object = None) -> _Rebuilt:
    r = _Rebuilt()
    r.key, r.dtype = storage
    r.offset, r.size, r.stride = storage_offset, tuple(size), tuple(stride)
    return r


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(_STORAGE_DTYPES[name])
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Tuple[str, torch.dtype]:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise pickle.UnpicklingError("persistent id")
        return (str(pid[2]), pid[1].dtype)


def _entries(mv: _Bytes, base: int = 0) -> Optional[Dict[str, _Entry]]:
    """{name: (local header offset, size, method)} from the central directory,
    or None for anything unusual (zip64 sizes, comments, ...). mv holds the
    archive's bytes from offset base to its end (base > 0: its tail only,
    which must hold the whole central directory)."""
    n = len(mv)
    if n < 22:
        return None
    eocd = bytes(mv[n - 22 : n])
    if eocd[:4] != b"PK\x05\x06":
        # torch writes no archive comment; a zip64 end record sits before
        # the classic one.
        return None
    count = struct.unpack_from("<H", eocd, 10)[0]
    cd_size, cd_off = struct.unpack_from("<II", eocd, 12)
    if cd_off == 0xFFFFFFFF or count == 0xFFFF:
        return None
    if cd_off < base or cd_off + cd_size > base + n:
        return None
    cd = bytes(mv[cd_off - base : cd_off - base + cd_size])
    out: Dict[str, _Entry] = {}
    p = 0
    for _ in range(count):
        if cd[p : p + 4] != b"PK\x01\x02":
            return None
        method = struct.unpack_from("<H", cd, p + 10)[0]
        csize, usize = struct.unpack_from("<II", cd, p + 20)
        nlen, elen, clen = struct.unpack_from("<HHH", cd, p + 28)
        loff = struct.unpack_from("<I", cd, p + 42)[0]
        if 0xFFFFFFFF in (csize, usize, loff):
            return None
        out[cd[p + 46 : p + 46 + nlen].decode("utf-8", "replace")] = (loff, usize, method)
        p += 46 + nlen + elen + clen
    return out


def _data(mv: _Bytes, entry: _Entry, base: int = 0) -> Optional[_Bytes]:
    """A stored zip record's bytes (entry: its local header's archive offset,
    size, method), mv holding the archive from offset base; None when it is
    not a stored record wholly inside mv."""
    loff, size, method = entry
    p = loff - base
    if method != 0 or p < 0 or p + 30 > len(mv) or bytes(mv[p : p + 4]) != b"PK\x03\x04":
        return None
    nlen, elen = struct.unpack_from("<HH", mv, p + 26)
    start = p + 30 + nlen + elen
    if start + size > len(mv):
        return None
    return mv[start : start + size]


def view_tensor(mv: memoryview) -> Optional[torch.Tensor]:
    """The tensor stored in the torch.save archive mv (a writable
    memoryview), as a view of mv, or None when the archive is not the plain
    one-tensor, one-storage, little-endian layout."""
    try:
        ents = _entries(mv)
        if not ents:
            return None
        pkl = [k for k in ents if k.endswith("/data.pkl")]
        if len(pkl) != 1:
            return None
        top = pkl[0][: -len("data.pkl")]
        bo = ents.get(top + "byteorder")
        if bo is not None and bytes(_data(mv, bo) or b"") != b"little":
            return None
        pkl_bytes = _data(mv, ents[pkl[0]])
        if pkl_bytes is None:
            return None
        r = _Unpickler(io.BytesIO(bytes(pkl_bytes))).load()
        if not isinstance(r, _Rebuilt):
            return None
        ent = ents.get(f"{top}data/{r.key}")
        if ent is None:
            return None
        raw = _data(mv, ent)
        if raw is None:
            return None
        esize = torch.empty((), dtype=r.dtype).element_size()
        if len(raw) % esize:
            return None
        flat = torch.frombuffer(raw, dtype=r.dtype) if len(raw) else torch.empty(0, dtype=r.dtype)
        return torch.as_strided(flat, r.size, r.stride, r.offset)
    except (pickle.UnpicklingError, struct.error, ValueError, RuntimeError, EOFError, KeyError, TypeError):
        return None


_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a zip local file header (30 bytes)


class Located:
    """Where a torch.save archive keeps its one tensor's storage: the bytes
    [start, end) of the archive, of dtype, holding the tensor of size
    row-major from element 0. head is the archive's bytes before start."""

    __slots__ = ("start", "end", "dtype", "size", "head", "_pkl", "_storage")

    start: int
    end: int
    dtype: torch.dtype
    size: Tuple[int, ...]
    head: bytes
    _pkl: Tuple[str, _Entry]
    _storage: Tuple[str, _Entry]

    def confirm(self, head: _Bytes, tail: _Bytes, total: int) -> bool:
        """Whether an archive of total bytes whose first bytes are head and
        whose bytes from end on are tail is the archive this was located in:
        the same head, and a central directory (in tail) that names the same
        data.pkl and storage records, the storage record holding exactly
        [start, end), and little-endian byte order."""
        try:
            if bytes(head) != self.head:
                return False
            ents = _entries(tail, self.end)
            if not ents:
                return False
            pkls = [k for k in ents if k.endswith("/data.pkl")]
            if pkls != [self._pkl[0]] or ents[self._pkl[0]] != self._pkl[1]:
                return False
            if ents.get(self._storage[0]) != self._storage[1]:
                return False
            bo = ents.get(self._pkl[0][: -len("data.pkl")] + "byteorder")
            if bo is not None:
                loff, size, method = bo
                if method != 0:
                    return False
                # The record lies wholly in the head or wholly in the tail.
                if loff + 30 <= self.start:
                    src, base = head, 0
                elif loff >= self.end:
                    src, base = tail, self.end
                else:
                    return False
                val = _data(src, bo, base)
                if val is None or bytes(val) != b"little":
                    return False
            return True
        except (struct.error, ValueError, IndexError):
            return False


def _contiguous(size: Sequence[int], stride: Sequence[int]) -> bool:
    want = 1
    for d in range(len(size) - 1, -1, -1):
        if size[d] != 1 and stride[d] != want:
            return False
        want *= size[d]
    return True


def locate_storage(head: _Bytes) -> Optional[Located]:
    """A Located for the torch.save archive whose first bytes are head (a
    buffer), or None. The archive must start with its data.pkl record, a
    one-tensor pickle the restricted unpickler reads (contiguous, from
    element 0 of its storage, which it fills exactly), followed by stored
    records up to the storage's, all within head. torch writes each record
    with a data descriptor after its bytes (sizes 0 in the local header):
    data.pkl ends where its pickle stops, the small records where their
    descriptor says, the storage after the bytes its pickle declares.
    Anything else (zip64, compression, another order) is None and the
    caller reads the item as a whole."""
    try:
        hb = bytes(memoryview(head).cast("B"))
        p = 0
        pkl: Optional[Tuple[str, _Entry]] = None
        r: Optional[_Rebuilt] = None
        top = ""
        byteorder: Optional[bytes] = None
        while p + 30 <= len(hb):
            sig, _, flags, method, _, _, _, csize, usize, nlen, elen = _LOCAL.unpack_from(hb, p)
            if sig != b"PK\x03\x04" or method != 0 or csize != usize or usize == 0xFFFFFFFF:
                return None
            desc = bool(flags & 0x08)
            name = hb[p + 30 : p + 30 + nlen].decode("utf-8", "replace")
            start = p + 30 + nlen + elen
            if pkl is None:
                if not name.endswith("/data.pkl"):
                    return None
                top = name[: -len("data.pkl")]
                bio = io.BytesIO(hb[start:] if desc else hb[start : start + usize])
                got = _Unpickler(bio).load()
                size = bio.tell()
                if not isinstance(got, _Rebuilt) or got.offset != 0 or not _contiguous(got.size, got.stride):
                    return None
                r, pkl = got, (name, (p, size, 0))
            elif r is not None and name == f"{top}data/{r.key}":
                numel = 1
                for d in r.size:
                    numel *= d
                size = numel * torch.empty((), dtype=r.dtype).element_size()
                if size == 0 or (not desc and usize != size) or byteorder not in (None, b"little"):
                    return None
                loc = Located()
                loc.start, loc.end, loc.dtype, loc.size = start, start + size, r.dtype, r.size
                loc.head = hb[:start]
                loc._pkl, loc._storage = pkl, (name, (p, size, 0))
                return loc
            elif name.endswith("/data.pkl") or name.startswith(f"{top}data/"):
                return None  # a second pickle, or another storage first
            elif desc:
                described = _described_size(hb, start)
                if described is None:
                    return None
                size = described
            else:
                size = usize
            end = start + size
            if end > len(hb):
                return None
            if name == f"{top}byteorder":
                byteorder = hb[start:end]
            if desc:
                if hb[end : end + 4] != b"PK\x07\x08" or struct.unpack_from("<II", hb, end + 8) != (size, size):
                    return None
                end += 16
            p = end
        return None
    except (pickle.UnpicklingError, struct.error, ValueError, RuntimeError, EOFError, KeyError, TypeError,
            AttributeError, IndexError):
        return None


def _described_size(hb: bytes, start: int, limit: int = 4096) -> Optional[int]:
    """The size of a small record starting at start and followed by a data
    descriptor (the first descriptor signature whose sizes equal its
    distance from start), or None."""
    at = start
    while True:
        at = hb.find(b"PK\x07\x08", at, start + limit)
        if at < 0 or at + 16 > len(hb):
            return None
        if struct.unpack_from("<II", hb, at + 8) == (at - start, at - start):
            return at - start
        at += 1

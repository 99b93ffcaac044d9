"""A fast path for the torch.save archives DCP stores one per item.

``view_tensor``: the tensor stored in a torch.save archive, as a view of
  the archive's bytes (no copy), found through the zip central directory
  and a restricted reading of ``data.pkl`` that only knows
  ``torch._utils._rebuild_tensor_v2`` and the storage classes. Anything
else returns None, and the caller falls back to ``torch.load``.
"""

import collections
import io
import pickle
import struct

import torch

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


class _Storage:
    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    r = _Rebuilt()
    r.key, r.dtype = storage
    r.offset, r.size, r.stride = storage_offset, tuple(size), tuple(stride)
    return r


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(_STORAGE_DTYPES[name])
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise pickle.UnpicklingError("persistent id")
        return (str(pid[2]), pid[1].dtype)


def _entries(mv):
    """{name: (local header offset, size, method)} from the central directory,
    or None for anything unusual (zip64 sizes, comments, ...)."""
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
    if cd_off + cd_size > n:
        return None
    cd = bytes(mv[cd_off : cd_off + cd_size])
    out = {}
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


def _data(mv, entry):
    loff, size, method = entry
    if method != 0 or bytes(mv[loff : loff + 4]) != b"PK\x03\x04":
        return None
    nlen, elen = struct.unpack_from("<HH", mv, loff + 26)
    start = loff + 30 + nlen + elen
    if start + size > len(mv):
        return None
    return mv[start : start + size]


def view_tensor(mv):
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
        r = _Unpickler(io.BytesIO(bytes(_data(mv, ents[pkl[0]])))).load()
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

"""The integrity object's CRC32Cs for the reader, in bounded memory.

json.loads builds a dict per item (about 12 times the object's size); the
reader only needs (object, offset, length) -> crc32c. The items written by
ckptkit's writers (Go's EncodeIntegrity, Python's encode_integrity) have one
compact form, ``{"object":"...","offset":N,"length":N,"crc32c":N}``, which is
read here item by item into three arrays per object (20 bytes per item), so
reading the object costs its size plus a fraction of it. A body in another
form is read with json (decode_integrity). The Go core has already checked
the same object when it opened the checkpoint (docs/TORCH_DCP.md).
"""

import array
import bisect
import json
import re
from typing import Callable, Dict, Optional, Tuple, Union

#: (object, offset, length) of an item.
ItemKey = Tuple[str, int, int]
_Arrays = Tuple["array.array[int]", "array.array[int]", "array.array[int]"]

_ITEM = re.compile(rb'\{"object":"((?:[^"\\]|\\.)*)","offset":(\d+),"length":(\d+),"crc32c":(\d+)\}')
_ITEMS_KEY = b'"items":['


class ItemCRCs:
    """A read-only {(object, offset, length): crc32c} mapping (``get``)."""

    def __init__(self) -> None:
        self._by_object: Dict[str, _Arrays] = {}  # object -> (offsets, lengths, crcs), sorted by (offset, length)

    def _add(self, obj: str, offset: int, length: int, crc: int) -> None:
        arrs = self._by_object.get(obj)
        if arrs is None:
            arrs = self._by_object[obj] = (array.array("q"), array.array("q"), array.array("I"))
        arrs[0].append(offset)
        arrs[1].append(length)
        arrs[2].append(crc)

    def _sort(self) -> None:
        for obj, (offs, lens, crcs) in list(self._by_object.items()):
            n = len(offs)
            if all((offs[i], lens[i]) <= (offs[i + 1], lens[i + 1]) for i in range(n - 1)):
                continue
            order = sorted(range(n), key=lambda i: (offs[i], lens[i]))
            self._by_object[obj] = (array.array("q", (offs[i] for i in order)),
                                    array.array("q", (lens[i] for i in order)),
                                    array.array("I", (crcs[i] for i in order)))

    def get(self, key: ItemKey, default: Optional[int] = None) -> Optional[int]:
        obj, offset, length = key
        arrs = self._by_object.get(obj)
        if arrs is None:
            return default
        offs, lens, crcs = arrs
        i = bisect.bisect_left(offs, offset)
        while i < len(offs) and offs[i] == offset:
            if lens[i] == length:
                return crcs[i]
            i += 1
        return default

    def __len__(self) -> int:
        return sum(len(a[0]) for a in self._by_object.values())


#: What read_item_crcs returns: an ItemCRCs, or what fallback made of a
#: body in another form.
CRCMap = Union["ItemCRCs", Dict[ItemKey, int]]


def read_item_crcs(data: bytes, fallback: Callable[[bytes], Dict[ItemKey, int]]) -> CRCMap:
    """The CRC32Cs of an integrity object's bytes (header already checked by
    the caller's rules: fallback(data) is decode_integrity, used for its
    checks and for a body not in the compact form)."""
    head = bytes(data[:64]).decode("ascii", "replace")
    fields = head.split()
    if not head.startswith("ckptkit-dcp-integrity/1 ") or len(fields) < 2 or not fields[1].isdigit() \
            or int(fields[1]) != len(data):
        return fallback(data)  # raises, naming the header
    body = memoryview(data)[64:]
    raw = bytes(body[:min(len(body), 4096)])
    at = raw.find(_ITEMS_KEY)
    if at < 0:
        return fallback(data)
    pos = at + len(_ITEMS_KEY)
    out = ItemCRCs()
    b = data
    off = 64 + pos
    first = True
    while True:
        if b[off:off + 1] == b"]":
            off += 1
            break
        if not first:
            if b[off:off + 1] != b",":
                return fallback(data)
            off += 1
        m = _ITEM.match(b, off)
        if m is None:
            return fallback(data)
        name = m.group(1)
        obj = json.loads(b'"' + name + b'"') if b"\\" in name else name.decode()
        out._add(obj, int(m.group(2)), int(m.group(3)), int(m.group(4)))
        off = m.end()
        first = False
    # The rest of the body (algorithm, optimizer, census), with the items
    # left out, through the same checks as decode_integrity.
    rest = b[:64 + pos] + b[off - 1:]
    fallback(_with_size(rest))
    out._sort()
    return out


def _with_size(data: bytes) -> bytes:
    """data with its header's size field set to its length."""
    head = f"ckptkit-dcp-integrity/1 {len(data)}".ljust(63).encode() + b"\n"
    return head + data[64:]

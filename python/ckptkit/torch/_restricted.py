"""The restricted unpickler ckptkit's Python reader checks DCP pickles with.

torch's DCP planner unpickles every bytes item with
``torch.load(weights_only=False)``, a general unpickler. StorageReader hands
it an item only after :func:`check_item` has read the item's pickle here:

* the allow-list is the Go unpickler's (interop/torchdcp/globals.go), read
  from ``pickle_allowlist.json``, which the Go test TestAllowListMatchesPython
  keeps identical to it: any other global raises ForbiddenGlobalError;
* nothing is imported or called: an allowed global resolves to an inert
  stand-in (calling it builds another), ``getattr`` only names a member of
  the memory-format enum, persistent ids only ``('storage', ...)``;
* the opcodes are the Go unpickler's (protocols 2-5; INST, OBJ, EXT*,
  text PERSID, the protocol-0 text opcodes and out-of-band buffers are
  refused), and so is its memo rule: a PUT may overwrite an entry or add the
  next one, never skip ahead (CPython's C unpickler, which torch.load uses,
  sizes its memo array by the highest index);
* the item must be what the Go reader reads: a zip archive (torch.load
  takes anything else for a legacy pickle stream) with one
  ``<folder>/data.pkl`` entry, stored uncompressed.

The unpickler is CPython's own reference one (``pickle._Unpickler``), so
every opcode it accepts has CPython's semantics.
"""

import importlib
import io
import json
import os
import pickle
import struct
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "pickle_allowlist.json"), encoding="utf-8") as _f:
    ALLOW_LIST = json.load(_f)["globals"]
del _f

MEM_FORMAT_MEMBERS = ("TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT")
ZIP_MAGIC = b"PK\x03\x04"

# Opcodes the Go unpickler refuses (interop/torchdcp/pickle.go): refused here too.
_REFUSED_OPCODES = {
    pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4, pickle.PERSID,
    pickle.INT, pickle.LONG, pickle.FLOAT, pickle.STRING, pickle.UNICODE, pickle.GET, pickle.PUT,
    b"\x97", b"\x98",  # NEXT_BUFFER, READONLY_BUFFER
}


class ForbiddenGlobalError(pickle.UnpicklingError):
    """A pickle names a global outside the allow-list (nothing was run)."""

    def __init__(self, module, name):
        super().__init__(f"forbidden pickle global {module}.{name} (not on the allow-list; nothing is executed)")
        self.module = module
        self.name = name


class _Inert:
    """What an allowed class stands for, and what calling one builds: an
    object that records nothing and runs nothing."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass

    def add(self, value):
        pass


def _inert_function(*args, **kwargs):
    return _Inert()


def _standin(module, name, kind):
    if kind == "getattr":
        def restricted_getattr(obj, member, *rest):
            if rest or getattr(type(obj), "_ckptkit_kind", None) != "enum-class" or member not in MEM_FORMAT_MEMBERS:
                raise ForbiddenGlobalError(module, f"getattr({type(obj).__name__}, {member!r})")
            return _Inert()
        return restricted_getattr
    if kind in ("get-layout", "rebuild-tensor", "codecs-encode"):
        return _inert_function
    if kind == "dtype":
        return _Inert()
    # Classes (NEWOBJ needs a type) and class-like callables.
    return type(name, (_Inert,), {"_ckptkit_kind": kind, "__module__": "ckptkit.torch._restricted"})


class RestrictedUnpickler(pickle._Unpickler):
    """CPython's reference unpickler with the Go reader's allow-list,
    opcodes and memo rule; see the module docstring."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, *, persistent=False):
        super().__init__(file)
        self._persistent = persistent

    def find_class(self, module, name):
        kind = ALLOW_LIST.get(module, {}).get(name)
        if kind is None:
            raise ForbiddenGlobalError(module, name)
        return _standin(module, name, kind)

    def persistent_load(self, pid):
        if not self._persistent:
            raise pickle.UnpicklingError("persistent id in a pickle that must not have one")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], type) and getattr(pid[1], "_ckptkit_kind", None) == "storage"
                and isinstance(pid[2], str) and isinstance(pid[3], str) and isinstance(pid[4], int)):
            raise pickle.UnpicklingError("persistent id is not ('storage', <storage class>, key, location, numel)")
        return _Inert()

    def _refuse(self):
        raise pickle.UnpicklingError("pickle opcode refused by ckptkit's restricted unpickler")

    for _op in _REFUSED_OPCODES:
        dispatch[_op[0]] = _refuse
    del _op

    def _load_proto(self):
        proto = self.read(1)[0]
        if not 2 <= proto <= 5:
            raise pickle.UnpicklingError(f"pickle protocol {proto} is not supported (2-5)")
        self.proto = proto

    dispatch[pickle.PROTO[0]] = _load_proto

    def _memo_put(self, i):
        if i > len(self.memo):
            raise pickle.UnpicklingError(f"memo index {i} skips ahead of the {len(self.memo)} entries so far")
        if not self.stack:
            raise pickle.UnpicklingError("stack underflow")
        self.memo[i] = self.stack[-1]

    def _load_binput(self):
        self._memo_put(self.read(1)[0])

    def _load_long_binput(self):
        self._memo_put(int.from_bytes(self.read(4), "little"))

    dispatch[pickle.BINPUT[0]] = _load_binput
    dispatch[pickle.LONG_BINPUT[0]] = _load_long_binput


def check_pickle(data, *, persistent=False):
    """Unpickle data with RestrictedUnpickler, for its errors only."""
    RestrictedUnpickler(io.BytesIO(data), persistent=persistent).load()


def item_pickle(item):
    """The data.pkl of a torch.save archive, as the Go reader finds it
    (interop/torchdcp openArchive), or pickle.UnpicklingError."""
    if bytes(item[:4]) != ZIP_MAGIC:
        raise pickle.UnpicklingError("item does not start with a zip local file header "
                                     "(torch.load would read it as a legacy pickle stream)")
    try:
        zf = zipfile.ZipFile(io.BytesIO(item))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise pickle.UnpicklingError(f"not a torch.save zip archive: {e}") from None
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise pickle.UnpicklingError("a zip entry appears twice")
    pkls = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")
            and not i.filename.startswith("/")]
    if len(pkls) != 1:
        raise pickle.UnpicklingError(f"zip holds {len(pkls)} <folder>/data.pkl entries, want 1")
    info = pkls[0]
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > len(item):
        raise pickle.UnpicklingError("data.pkl is compressed or larger than the item")
    if info.CRC == 0 and info.file_size > 0:
        # torch >= 2.7 saving with compute_crc32 = False records CRC-32 0:
        # no checksum to check (zipfile would report a bad CRC-32). The
        # stored bytes follow the entry's local header, as the Go reader
        # takes them.
        h = info.header_offset
        if bytes(item[h:h + 4]) != ZIP_MAGIC:
            raise pickle.UnpicklingError("data.pkl: no local file header at its offset")
        name_len, extra_len = struct.unpack_from("<HH", item, h + 26)
        start = h + 30 + name_len + extra_len
        data = bytes(item[start:start + info.file_size])
        if len(data) != info.file_size:
            raise pickle.UnpicklingError("data.pkl: the item ends inside it")
        return data
    try:
        return zf.read(info)
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise pickle.UnpicklingError(f"data.pkl: {e}") from None


def check_item(item):
    """Raise ForbiddenGlobalError or pickle.UnpicklingError unless item (a
    DCP bytes item: one torch.save archive) can be read by the restricted
    unpickler to its end; nothing in it is run."""
    try:
        check_pickle(item_pickle(item), persistent=True)
    except pickle.UnpicklingError:
        raise
    except (RecursionError, MemoryError):
        raise
    except Exception as e:  # a malformed pickle fails in many ways
        raise pickle.UnpicklingError(f"{type(e).__name__}: {e}") from None


class MetadataUnpickler(pickle.Unpickler):
    """CPython's C unpickler for a DCP ``.metadata`` the Go core has read
    and accepted: the same allow-list, resolved to the real classes (torch's
    DCP dataclasses, torch.Size, OrderedDict, ...), ``getattr`` only on the
    memory-format enum, ``_codecs.encode`` only latin-1, no persistent ids.
    Torch's planner needs the real Metadata, so this one builds it; the
    Go core's reading is the same (docs/TORCH_DCP.md, One grammar)."""

    def find_class(self, module, name):
        return real_global(module, name)


def _is_mem_format_enum(obj):
    return (isinstance(obj, type) and obj.__name__ in ("MEM_FORMAT_ENCODING", "_MEM_FORMAT_ENCODING")
            and obj.__module__.startswith("torch.distributed."))


def real_global(module, name, on_tensor=None):
    """The real object an allowed global names, for an unpickler that
    builds real objects (MetadataUnpickler; the differential test's
    reference reader): ``getattr`` restricted to the members of the
    memory-format enum, ``_codecs.encode`` to latin-1, anything off the
    allow-list ForbiddenGlobalError. A storage class or tensor rebuilder
    (kinds "storage", "rebuild-tensor") is ``on_tensor(kind, name)``, or
    forbidden when on_tensor is None: tensors have no place in .metadata."""
    kind = ALLOW_LIST.get(module, {}).get(name)
    if kind is None:
        raise ForbiddenGlobalError(module, name)
    if kind == "getattr":
        def restricted_getattr(obj, member):
            if not _is_mem_format_enum(obj) or member not in MEM_FORMAT_MEMBERS:
                raise ForbiddenGlobalError(module, f"getattr({getattr(obj, '__name__', type(obj).__name__)}, {member!r})")
            return getattr(obj, member)
        return restricted_getattr
    if kind == "codecs-encode":
        def encode(s, encoding):
            if not isinstance(s, str) or encoding not in ("latin1", "latin-1"):
                raise pickle.UnpicklingError("_codecs.encode only decodes latin1 strings")
            return s.encode("latin-1")
        return encode
    if kind in ("rebuild-tensor", "storage"):
        if on_tensor is None:
            raise ForbiddenGlobalError(module, name)
        return on_tensor(kind, name)
    return getattr(importlib.import_module("builtins" if module == "__builtin__" else module), name)


def load_metadata(data):
    """Unpickle a ``.metadata`` with MetadataUnpickler."""
    return MetadataUnpickler(io.BytesIO(data)).load()

"""Issue 29, one grammar: the differential corpus. Every pickle of
interop/torchdcp/testdata/differential.json (the .metadata objects and
item data.pkl entries of the torch 1.13 and 2.x fixtures, the FuzzUnpickle
corpus, crafted cases) is read here by CPython's own reference unpickler
(pickle._Unpickler, with the allow-list, opcodes and memo rule of the Go
reader, torch's real DCP classes and torch.Size, OrderedDict, set, ...),
and rendered in the canonical form the Go test TestDifferentialCorpusIsCurrent
recorded for the Go unpickler. Wherever the Go unpickler accepts a pickle,
CPython must read the same value, field by field; the crafted hostile cases
must be refused by both. (The Go unpickler may refuse more than CPython:
a refusal is never a second reading.)"""

import base64
import enum
import json
import os
import pathlib
import struct

import pytest
import torch

from ckptkit.torch._restricted import RestrictedUnpickler, real_global

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "torchdcp", "testdata",
                      "differential.json")

# interop/torchdcp/globals.go storageClasses.
STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
}


class _StorageClass:
    def __init__(self, name):
        self.name = name


class _Storage:
    def __init__(self, dtype, key, location, numel):
        self.args = (dtype, key, location, numel)


class _Tensor:
    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    return _Tensor(storage, offset, size, stride)


class Reference(RestrictedUnpickler):
    """CPython's reference unpickler, resolving the allow-list to the real
    objects (only ever constructors of plain values and torch's DCP
    dataclasses; getattr restricted as in Go; storages and tensors as
    records)."""

    def find_class(self, module, name):
        return real_global(module, name, on_tensor=lambda kind, n: _StorageClass(n) if kind == "storage" else _rebuild_tensor_v2)

    def persistent_load(self, pid):
        if not self._persistent:
            raise ValueError("persistent id")
        tag, cls, key, location, numel = pid
        if tag != "storage" or not isinstance(cls, _StorageClass):
            raise ValueError("persistent id")
        return _Storage(STORAGE_DTYPES[cls.name], key, location, numel)


def _int(n):
    return {"int": str(n)}


def canon(v, depth=0):
    """The canonical form of interop/torchdcp/differential_test.go canonical."""
    if depth > 256:
        raise ValueError("nested too deep")
    c = lambda x: canon(x, depth + 1)  # noqa: E731
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return {"float": struct.pack(">d", v).hex()}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, torch.Size):
        return {"size": [_int(n) for n in v]}
    if isinstance(v, tuple):
        return {"tuple": [c(x) for x in v]}
    if isinstance(v, list):
        return {"list": [c(x) for x in v]}
    if isinstance(v, (set, frozenset)):
        items = [c(x) for x in v]
        items.sort(key=lambda x: json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        return {"set": items}
    if isinstance(v, dict):
        return {"dict": [[c(k), c(x)] for k, x in v.items()]}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v)}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v)}
    if isinstance(v, enum.Enum):
        return {"enum": v.name}
    if isinstance(v, pathlib.PurePath):
        return str(v)
    if isinstance(v, _Storage):
        dtype, key, location, numel = v.args
        return {"storage": [dtype, key, location, _int(numel)]}
    if isinstance(v, _Tensor):
        storage, offset, size, stride = v.args
        return {"tensor": [c(storage), _int(offset), [_int(n) for n in size], [_int(n) for n in stride]]}
    if type(v).__module__.startswith("torch.distributed."):
        return {"object": type(v).__name__, "fields": [[k, c(x)] for k, x in sorted(vars(v).items())]}
    raise TypeError(f"no canonical form for {type(v).__name__}")


def _cases():
    with open(CORPUS, encoding="utf-8") as f:
        return json.load(f)["cases"]


def cpython_view(case):
    import io

    data = base64.b64decode(case["pickle"])
    return canon(Reference(io.BytesIO(data), persistent=case["persistent"]).load())


def test_differential_corpus():
    cases = _cases()
    assert len(cases) > 500
    agreed = go_refused = 0
    problems = []
    for case in cases:
        try:
            got, err = cpython_view(case), None
        except Exception as e:  # CPython refuses in many ways
            got, err = None, e
        if case.get("go_error"):
            go_refused += 1
            if case.get("both_refuse") and err is None:
                problems.append(f"{case['name']}: Go refuses ({case['go_error']}), CPython reads it")
            continue
        if err is not None:
            problems.append(f"{case['name']}: Go reads it, CPython refuses: {type(err).__name__}: {err}")
        elif got != case.get("go"):
            problems.append(f"{case['name']}: Go and CPython read different values:\n  go  {json.dumps(case.get('go'))[:400]}"
                            f"\n  cpy {json.dumps(got)[:400]}")
        else:
            agreed += 1
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} problems)"
    assert agreed > 500 and go_refused > 0


def test_metadata_unpickler_reads_what_go_reads():
    """The C unpickler StorageReader and resume read .metadata with
    (_restricted.MetadataUnpickler: the allow-list, real classes) reads
    every .metadata of the corpus the Go core accepts as the Go core does,
    and refuses the hostile ones."""
    from ckptkit.torch._restricted import load_metadata

    n = 0
    for case in _cases():
        data = base64.b64decode(case["pickle"])
        if case.get("both_refuse"):
            if "memo" not in case["name"]:  # the Go core refuses that one before Python sees it (it costs CPython GiBs)
                with pytest.raises(Exception):
                    load_metadata(data)
            continue
        if case["persistent"] or case.get("go_error") or not case["name"].endswith(".metadata") and not case[
                "name"].startswith("crafted/"):
            continue
        assert canon(load_metadata(data)) == case.get("go"), case["name"]
        n += 1
    assert n > 10

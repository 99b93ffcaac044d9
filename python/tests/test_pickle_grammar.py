"""Issue 29, one grammar: a `.metadata` crafted so that two readers could
read two checkpoints is read as the same checkpoint by the Go core (ckpt,
ckptkit.torch.resume) and by CPython (torch's own FileSystemReader and
ckptkit's StorageReader), or refused by ckptkit; a memo index that would
cost CPython gigabytes is refused before Python unpickles anything."""

import json
import os
import pickle
import resource
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata

import ckptkit
from ckptkit.torch import StorageReader, resume

from test_dcp import ckpt_cli, root_error

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")


def _save(path, value):
    dcp.save({"model": {"weight": torch.full((2, 2), value)}}, storage_writer=dcp.FileSystemWriter(path))


def _two_part_build(a, b):
    """A Metadata pickle (protocol 2) of NEWOBJ Metadata + BUILD((a, b))."""
    state = pickle.dumps((a, b), protocol=2)
    return (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81" + state[2:-1] + b"b.")


def _ab_checkpoint(tmp_path):
    """A checkpoint whose .metadata has checkpoint A (weights 1.0) as its
    BUILD dict state and checkpoint B (weights 666.0, in its own data file)
    as its slot state: CPython's load_build lets the slot state win."""
    _save(str(tmp_path / "A"), 1.0)
    _save(str(tmp_path / "B"), 666.0)
    ab = tmp_path / "AB"
    ab.mkdir()
    shutil.copy(tmp_path / "A" / "__0_0.distcp", ab / "__0_0.distcp")
    shutil.copy(tmp_path / "B" / "__0_0.distcp", ab / "__0_1.distcp")
    md_a = dcp.FileSystemReader(str(tmp_path / "A")).read_metadata()
    md_b = dcp.FileSystemReader(str(tmp_path / "B")).read_metadata()
    for info in md_b.storage_data.values():
        info.relative_path = "__0_1.distcp"
    (ab / ".metadata").write_bytes(_two_part_build(dict(vars(md_a)), dict(vars(md_b))))
    return ab


def test_ab_metadata_is_read_as_the_same_checkpoint_by_both(tmp_path):
    ab = _ab_checkpoint(tmp_path)
    url = "file://" + str(ab)
    # CPython, through torch's own reader: checkpoint B.
    out = {"model": {"weight": torch.zeros(2, 2)}}
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(ab)))
    assert torch.equal(out["model"]["weight"], torch.full((2, 2), 666.0))
    # CPython, through ckptkit's StorageReader (the Go core checked it first).
    out = {"model": {"weight": torch.zeros(2, 2)}}
    dcp.load(out, storage_reader=StorageReader(url))
    assert torch.equal(out["model"]["weight"], torch.full((2, 2), 666.0))
    # The Go core: resume loads through the Go loader, inspect lists the
    # objects it read from the metadata.
    m = nn.Linear(2, 2, bias=False)
    resume(url, m)
    assert torch.equal(m.weight.detach(), torch.full((2, 2), 666.0))
    r = ckpt_cli("inspect", "--json", url)
    assert r.returncode == 0, r.stderr
    objects = [o["key"] for o in json.loads(r.stdout)["objects"]]
    assert objects == ["__0_1.distcp"], objects
    r = ckpt_cli("verify", "--deep", url)
    assert r.returncode == 0, r.stdout + r.stderr


def test_memo_index_metadata_is_refused_before_python_unpickles_it(tmp_path):
    """Five bytes (LONG_BINPUT with a huge index) before STOP: CPython's C
    unpickler would allocate an array for the index (gigabytes); the Go
    core refuses it at open, so StorageReader and resume never unpickle it."""
    _save(str(tmp_path / "ck"), 1.0)
    md = tmp_path / "ck" / ".metadata"
    raw = md.read_bytes()
    assert raw.endswith(b".")
    md.write_bytes(raw[:-1] + b"r\xff\xff\xff\x0f" + b".")
    url = "file://" + str(tmp_path / "ck")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ckptkit.BadCheckpointError, match="memo index"):
        StorageReader(url).read_metadata()
    with pytest.raises(ckptkit.BadCheckpointError, match="memo index"):
        resume(url, nn.Linear(2, 2, bias=False))
    with pytest.raises(BaseException) as e:
        dcp.load({"model": {"weight": torch.zeros(2, 2)}}, storage_reader=StorageReader(url))
    assert "memo index" in str(root_error(e.value))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 64 << 20, grown
    r = ckpt_cli("verify", url)
    assert r.returncode == 1 and "memo index" in r.stderr


def test_storage_reader_refuses_what_the_go_core_refuses(tmp_path):
    """A DCP class named under another torch.distributed.checkpoint module
    (CPython would import it): refused by the Go core, so by StorageReader."""
    _save(str(tmp_path / "ck"), 1.0)
    md = tmp_path / "ck" / ".metadata"
    raw = pickle.dumps(dcp.FileSystemReader(str(tmp_path / "ck")).read_metadata(), protocol=2)
    mod = b"ctorch.distributed.checkpoint.metadata\nMetadata\n"
    assert mod in raw
    md.write_bytes(raw.replace(mod, b"ctorch.distributed.checkpoint.planner\nMetadata\n"))
    assert pickle.loads(md.read_bytes()).state_dict_metadata  # CPython imports planner and reads it
    with pytest.raises(ckptkit.BadCheckpointError, match="forbidden pickle global"):
        StorageReader("file://" + str(tmp_path / "ck")).read_metadata()
    assert os.path.exists(md)


def test_integrity_object_is_read_in_bounded_memory():
    """The reader's CRC32C map of a large integrity object costs a fraction
    of its size (json.loads cost about 12 times), and a header claiming
    1 GiB on a small object is refused before anything is read into it."""
    import tracemalloc

    from ckptkit.torch._crcs import read_item_crcs
    from ckptkit.torch._storage import decode_integrity, encode_integrity

    n = 100_000
    items = [{"object": f"__{i % 4}_0.0123456789abcdef.distcp", "offset": 4096 * i, "length": 4000 + i % 7,
              "crc32c": (i * 2654435761) % (1 << 32)} for i in range(n)]
    data = encode_integrity(items, "saved")
    want = {(i["object"], i["offset"], i["length"]): i["crc32c"] for i in items[::997]}
    del items
    fallback = lambda d: decode_integrity(d)[0]  # noqa: E731
    tracemalloc.start()
    crcs = read_item_crcs(data, fallback)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(crcs) == n
    for k, v in want.items():
        assert crcs.get(k) == v
    assert crcs.get(("__0_0.0123456789abcdef.distcp", 1, 2)) is None
    assert peak < len(data) // 2 + (16 << 20), (peak, len(data))
    # The same map from json, for a body in another form.
    spaced = data[:64] + data[64:].replace(b'","offset":', b'", "offset":')
    spaced = f"ckptkit-dcp-integrity/1 {len(spaced)}".ljust(63).encode() + b"\n" + spaced[64:]
    assert read_item_crcs(spaced, fallback).get(next(iter(want))) == next(iter(want.values()))
    # A header claiming 1 GiB: refused.
    claim = f"ckptkit-dcp-integrity/1 {1 << 30}".ljust(63).encode() + b"\n" + b'{"algorithm":"crc32c","items":[]}'
    with pytest.raises(ckptkit.BadCheckpointError):
        read_item_crcs(claim, fallback)

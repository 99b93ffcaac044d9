"""ckptkit.torch.StorageWriter / StorageReader against torch's own
FileSystemWriter / FileSystemReader and the ckpt CLI."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageReader, StorageWriter, decode_integrity
from ckptkit.torch._storage import integrity_key, save_tag

from conftest import sub_url

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 33, generator=g),
        "half": torch.randn(7, generator=g).to(torch.float16),
        "bf": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "mask": torch.tensor([True, False, True]),
        "view": torch.randn(10, 10, generator=g)[2:5],  # a view of a larger storage
        "nested": {"x": torch.randn(4, generator=g), "lr": 0.125, "name": "run7", "betas": (0.9, 0.999)},
        "step": 42,
    }


def _zeros_like(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = _zeros_like(v)
        elif torch.is_tensor(v):
            out[k] = torch.zeros_like(v)
        else:
            out[k] = None
    return out


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_equal(a[k], b[k])
        elif torch.is_tensor(a[k]):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def root_error(exc):
    """The ckptkit error inside dcp's CheckpointException (which wraps what a
    storage layer raises, per rank)."""
    failures = getattr(exc, "failures", None)
    if failures:
        inner = next(iter(failures.values()))
        return inner[0] if isinstance(inner, tuple) else inner
    return exc


def ckpt_cli(*args):
    """Run the ckpt CLI (bin/ckpt, built by scripts/test.sh)."""
    exe = os.environ.get("CKPTKIT_CKPT_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "bin", "ckpt")
    if not os.path.exists(exe):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exe} missing (go build -o bin/ckpt ./cmd/ckpt)")
        pytest.skip(f"{exe} missing (go build -o bin/ckpt ./cmd/ckpt)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_round_trip_on_every_backend(base_url):
    url = sub_url(base_url, "ck")
    sd = _state()
    dcp.save(sd, storage_writer=StorageWriter(url, part_size=4096))
    st = ckptkit.Store(url)
    keys = [o.key for o in st.list()]
    assert ".metadata" in keys and any(k.startswith(".ckptkit-integrity.") for k in keys)
    assert len([k for k in keys if k.endswith(".distcp")]) > 1  # parts of at most part_size
    out = _zeros_like(sd)
    dcp.load(out, storage_reader=StorageReader(url))
    _assert_equal(out, sd)
    if not url.startswith("mem:"):  # mem:// lives in this process only
        r = ckpt_cli("verify", "--deep", url)
        assert r.returncode == 0, r.stdout + r.stderr


def test_torch_filesystem_reader_loads_what_storage_writer_wrote(file_url):
    sd = _state(1)
    dcp.save(sd, storage_writer=StorageWriter(file_url + "/ck"))
    out = _zeros_like(sd)
    dcp.load(out, storage_reader=dcp.FileSystemReader(file_url[len("file://"):] + "/ck"))
    _assert_equal(out, sd)
    # DCP's layout, every object named for the save (docs/TORCH.md):
    # __<rank>_<n>.<tag>.distcp, .ckptkit-integrity.<tag>, and .metadata,
    # whose storage_meta.save_id gives the tag.
    md = dcp.FileSystemReader(file_url[len("file://"):] + "/ck").read_metadata()
    tag = save_tag(md.storage_meta.save_id)
    assert len(tag) == 16
    names = sorted(os.listdir(file_url[len("file://"):] + "/ck"))
    assert names == [f".ckptkit-integrity.{tag}", ".metadata", f"__0_0.{tag}.distcp"]


def test_storage_reader_loads_what_torch_wrote(file_url):
    path = file_url[len("file://"):] + "/ck"
    sd = _state(2)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
    out = _zeros_like(sd)
    dcp.load(out, storage_reader=StorageReader(file_url + "/ck"))
    _assert_equal(out, sd)


def test_storage_reader_loads_what_torch_saved_without_zip_crcs():
    # torch >= 2.7 with compute_crc32 = False records CRC-32 0 for every zip
    # entry; the Go core refused such a checkpoint ("zip: checksum error").
    import hashlib

    from conftest import fixtures_dir

    path = os.path.join(fixtures_dir(), "torch2.14", "sgd_momentum_nocrc")
    with open(os.path.join(path, "expected.json")) as f:
        want = json.load(f)
    sd = {k["key"]: torch.zeros(k["shape"], dtype=getattr(torch, k["dtype"])) for k in want["keys"] if k["kind"] == "tensor"}
    sd["step"] = 0
    dcp.load(sd, storage_reader=StorageReader(path))
    assert sd["step"] == 3
    for k in want["keys"]:
        if k["kind"] == "tensor":
            assert hashlib.sha256(sd[k["key"]].numpy().tobytes()).hexdigest() == k["sha256"], k["key"]


def test_storage_reader_of_an_empty_url_says_nothing_is_stored(file_url):
    # It said "file://... is a  checkpoint, not DCP".
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as ei:
        dcp.load({"w": torch.zeros(2)}, storage_reader=StorageReader(file_url + "/nothing"))
    (failure,) = ei.value.failures.values()
    if isinstance(failure, tuple):  # torch keeps (exception, traceback)
        failure = failure[0]
    assert isinstance(failure, ckptkit.NotFoundError), failure
    assert "no committed checkpoint is stored there" in str(failure)
    assert file_url + "/nothing" in str(failure)


def _flip_byte_in_tensor(path, key):
    md = dcp.FileSystemReader(path).read_metadata()
    (idx, info), = [(i, s) for i, s in md.storage_data.items() if i.fqn == key]
    f = os.path.join(path, info.relative_path)
    with open(f, "r+b") as fh:
        at = info.offset + info.length - 8  # inside the tensor's bytes
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x40]))
    return info.relative_path, at


def test_flipped_byte_is_refused_by_reader_and_verify(file_url):
    path = file_url[len("file://"):] + "/ck"
    sd = _state(3)
    dcp.save(sd, storage_writer=StorageWriter(file_url + "/ck"))
    obj, _ = _flip_byte_in_tensor(path, "w")
    out = _zeros_like(sd)
    with pytest.raises(BaseException) as e:  # dcp.CheckpointException is a BaseException
        dcp.load(out, storage_reader=StorageReader(file_url + "/ck"))
    err = root_error(e.value)
    assert isinstance(err, ckptkit.ChecksumError), repr(e.value)
    msg = str(err)
    assert "'w'" in msg and obj in msg and "offset" in msg
    r = ckpt_cli("verify", "--deep", file_url + "/ck")
    assert r.returncode != 0
    assert "checksum" in r.stdout + r.stderr and obj in r.stdout + r.stderr


def test_integrity_object_lists_every_item(file_url):
    sd = _state(4)
    dcp.save(sd, storage_writer=StorageWriter(file_url + "/ck"))
    st = ckptkit.Store(file_url + "/ck")
    md = dcp.FileSystemReader(file_url[len("file://"):] + "/ck").read_metadata()
    crcs, body = decode_integrity(st.read(integrity_key(md.storage_meta.save_id)))
    assert len(crcs) == len(md.storage_data)
    for info in md.storage_data.values():
        item = st.read(info.relative_path, info.offset, info.length)
        assert crcs[(info.relative_path, info.offset, info.length)] == ckptkit.crc32c(item)


def test_metadata_is_the_commit_point(file_url):
    url = file_url + "/ck"
    dcp.save(_state(), storage_writer=StorageWriter(url))
    with pytest.raises(BaseException) as e:  # dcp.CheckpointException is a BaseException
        dcp.save(_state(), storage_writer=StorageWriter(url))
    assert isinstance(root_error(e.value), ckptkit.ConflictError), repr(e.value)
    dcp.save(_state(5), storage_writer=StorageWriter(url, overwrite=True))
    out = _zeros_like(_state())
    dcp.load(out, storage_reader=StorageReader(url))
    _assert_equal(out, _state(5))


def test_ckpt_inspect_reads_it(base_url):
    if base_url.startswith("mem:"):
        pytest.skip("mem:// lives in this process only")
    url = sub_url(base_url, "ck")
    dcp.save(_state(), storage_writer=StorageWriter(url))
    r = ckpt_cli("inspect", "--json", url)
    assert r.returncode == 0, r.stderr
    assert "torch-dcp" in r.stdout and '"w"' in r.stdout


def test_metadata_read_once_per_load(file_url, tmp_path):
    """Counted at the backend, in a fresh process with counting on."""
    dcp.save(_state(), storage_writer=StorageWriter(file_url + "/ck"))
    script = tmp_path / "count.py"
    script.write_text(
        "import json, sys, torch, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import torch.distributed.checkpoint as dcp, ckptkit\n"
        "from ckptkit.torch import StorageReader\n"
        "sd = {'w': torch.zeros(64, 33), 'step': 0}\n"
        "dcp.load(sd, storage_reader=StorageReader(sys.argv[1]))\n"
        "print(json.dumps({'md': ckptkit.io_count('read', '.metadata'), 'reads': ckptkit.io_count('read')}))\n"
    )
    env = dict(os.environ, CKPTKIT_IO_COUNT="1")
    r = subprocess.run([sys.executable, str(script), file_url + "/ck"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["md"] == 1, got


def test_ckpt_copy_and_diff_carry_the_integrity_object(base_url, file_url):
    if base_url.startswith("mem:"):
        pytest.skip("mem:// lives in this process only")
    src = file_url + "/src"
    sd = _state(6)
    dcp.save(sd, storage_writer=StorageWriter(src))
    dst = sub_url(base_url, "copy")
    r = ckpt_cli("copy", src, dst)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ckptkit.Store(dst).exists(integrity_key(dcp.FileSystemReader(src[len("file://"):]).read_metadata().storage_meta.save_id))
    out = _zeros_like(sd)
    dcp.load(out, storage_reader=StorageReader(dst))
    _assert_equal(out, sd)
    r = ckpt_cli("diff", src, dst)
    assert r.returncode == 0, r.stdout + r.stderr
    r = ckpt_cli("verify", "--deep", dst)
    assert r.returncode == 0, r.stdout + r.stderr

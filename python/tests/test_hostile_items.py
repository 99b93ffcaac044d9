"""Issue 29: no checkpoint that verifies can run code. A bytes item whose
pickle calls os.system (a payload object put into param_groups[0]["lr"]
before a real save) is refused by every reader: ckpt verify --deep, ckpt
latest --deep, ckpt copy, ckptkit.torch.resume and dcp.load through
StorageReader, naming the key and the global, and the payload never runs
(its marker file is never created). The restricted unpickler the Python
reader checks items with (ckptkit.torch._restricted) is tested directly
too."""

import io
import os
import pickle
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageReader, resume, save
from ckptkit.torch._restricted import ALLOW_LIST, ForbiddenGlobalError, check_item, check_pickle

from conftest import sub_url
from models import make, train
from test_dcp import ckpt_cli, root_error

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")

KEY = "optimizer.param_groups.0.lr"


class Payload:
    """Pickles as os.system("touch <marker>"): unpickling it with a general
    unpickler creates the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


GLOBAL = f"{os.system.__module__}.system"  # posix.system


def _hostile_save(run_url, marker, writer, step=1):
    """A real checkpoint (step 1 of run_url) whose KEY item is the payload:
    written by ckptkit.torch.save (StorageWriter, with CRC32Cs) or by
    torch's FileSystemWriter (no CRC32Cs). Returns the checkpoint URL."""
    m, opt, sched = make()
    train(m, opt, sched, 1)
    lr = opt.param_groups[0]["lr"]
    opt.param_groups[0]["lr"] = Payload(marker)
    try:
        if writer == "ckptkit":
            return save(run_url, m, opt, step=step, scheduler=sched)
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(m, opt)
        url = sub_url(run_url, f"step-{step:08d}")
        dcp.save({"model": msd, "optimizer": osd}, storage_writer=dcp.FileSystemWriter(url[len("file://"):]))
        return url
    finally:
        opt.param_groups[0]["lr"] = lr


def _assert_names_key_and_global(text):
    assert KEY in text, text
    assert GLOBAL in text, text


@pytest.fixture(params=["ckptkit", "torch"])
def hostile(request, file_url, tmp_path):
    marker = tmp_path / "PWNED"
    run = sub_url(file_url, "run")
    url = _hostile_save(run, marker, request.param)
    assert not marker.exists()
    # The payload is really there: a general unpickler would run it.
    md = dcp.FileSystemReader(url[len("file://"):]).read_metadata()
    assert KEY in md.state_dict_metadata
    yield run, url, marker
    assert not marker.exists(), "the payload ran"


def test_cli_refuses_the_payload(hostile, tmp_path):
    run, url, marker = hostile
    for args in (["verify", "--deep", url], ["verify", url], ["latest", "--deep", run],
                 ["copy", url, "file://" + str(tmp_path / "copy")]):
        r = ckpt_cli(*args)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        _assert_names_key_and_global(r.stdout + r.stderr)
        assert "bad-checkpoint" in r.stderr or "bad checkpoint" in (r.stdout + r.stderr).lower() or "forbidden" in r.stderr
    assert not (tmp_path / "copy" / ".metadata").exists()
    r = ckpt_cli("verify", "--deep", "--json", url)
    assert r.returncode == 1
    assert "bad-checkpoint" in r.stdout + r.stderr


def test_dcp_load_through_storage_reader_refuses_the_payload(hostile):
    run, url, marker = hostile
    m, opt, _ = make(seed=3)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(m, opt)
    with pytest.raises(BaseException) as e:  # dcp.CheckpointException is a BaseException
        dcp.load({"model": msd, "optimizer": osd}, storage_reader=StorageReader(url))
    _assert_refused(e.value)


def _assert_refused(exc):
    """dcp.load's CheckpointException holds the storage layer's error: a
    BadCheckpointError naming key and global (torch 2.14 turns an error of
    read_metadata into an AssertionError with its message, issue 22)."""
    err = root_error(exc)
    assert isinstance(err, ckptkit.BadCheckpointError) or (
        isinstance(err, AssertionError) and "metadata read failed" in str(err)), repr(exc)
    _assert_names_key_and_global(str(err))


def test_resume_refuses_the_payload(hostile):
    run, url, marker = hostile
    m, opt, sched = make(seed=3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    for target in (url, run):
        with pytest.raises(ckptkit.BadCheckpointError) as e:
            resume(target, m, opt, scheduler=sched)
        _assert_names_key_and_global(str(e.value))
        for k, v in m.state_dict().items():
            assert torch.equal(v, before[k]), k
        assert not opt.state


def _same_length(item, length):
    """item (a zip archive) rewritten to exactly length bytes, padded with a
    zip comment (as the Go helper ckpttest.PlantForbiddenGlobal does)."""

    def build(pad):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(item)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for zi in src.infolist():
                dst.writestr(zi.filename, src.read(zi))
            dst.comment = b" " * pad
        return out.getvalue()

    base = build(0)
    assert len(base) <= length, (len(base), length)
    return build(length - len(base))


@pytest.mark.parametrize("writer", ["ckptkit", "torch"])
def test_resume_of_a_run_falls_back_past_the_payload(file_url, tmp_path, writer):
    """The newest checkpoint of a run holds the payload: resume (and
    StorageReader on the run) take the older valid one, naming the skipped
    one's key and global."""
    marker = tmp_path / "PWNED"
    run = sub_url(file_url, "run")
    m, opt, sched = make()
    train(m, opt, sched, 1)
    save(run, m, opt, step=1, scheduler=sched)
    _hostile_save(run, marker, writer, step=2)
    m2, opt2, sched2 = make(seed=3)
    rep = resume(run, m2, opt2, scheduler=sched2)
    assert rep.checkpoint_step == 1
    reasons = " ".join(s.reason for s in rep.skipped)
    assert KEY in reasons and GLOBAL in reasons, rep.skipped
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert not marker.exists()


def test_storage_reader_checks_items_it_reads_itself(file_url, tmp_path, monkeypatch):
    """The reader's own check, apart from the Go core's at open: the item is
    replaced after the checkpoint was opened (torch wrote it, so no CRC32C
    notices), and read_data still refuses it before torch's planner sees it."""
    monkeypatch.chdir(tmp_path)
    key = "optimizer.param_groups.0.params"
    m, opt, sched = make()
    train(m, opt, sched, 1)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(m, opt)
    path = str(tmp_path / "ck")
    dcp.save({"model": msd, "optimizer": osd}, storage_writer=dcp.FileSystemWriter(path))
    md = dcp.FileSystemReader(path).read_metadata()
    (info,) = [s for i, s in md.storage_data.items() if i.fqn == key]
    item = _same_length(_torch_save(Payload("P1")), info.length)
    # The planted item is a real payload: torch.load runs it.
    torch.load(io.BytesIO(_same_length(_torch_save(Payload("P0")), info.length)), weights_only=False)
    assert (tmp_path / "P0").exists()
    ck = ckptkit.torch.Checkpoint(file_url + "/ck")
    try:
        with open(os.path.join(path, info.relative_path), "r+b") as f:
            f.seek(info.offset)
            f.write(item)
        m2, opt2, sched2 = make(seed=4)
        train(m2, opt2, sched2, 1)
        msd2, osd2 = get_state_dict(m2, opt2)
        with pytest.raises(BaseException) as e:
            dcp.load({"model": msd2, "optimizer": osd2}, storage_reader=StorageReader(ck))
        err = root_error(e.value)
        assert isinstance(err, ckptkit.BadCheckpointError), repr(e.value)
        assert key in str(err) and GLOBAL in str(err), str(err)
    finally:
        ck.close()
    assert not (tmp_path / "P1").exists(), "the payload ran"


def _torch_save(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_restricted_unpickler_reads_plain_items():
    for v in (0.01, 3, "x", None, True, (0.9, 0.999), [1, 2], {"a": 1, 2: "b"}, b"raw", {1, 2}, frozenset({3}),
              torch.tensor([1.0, 2.0]), {"t": torch.zeros(2, 3)}, __import__("collections").OrderedDict(a=1)):
        check_item(_torch_save(v))


def test_restricted_unpickler_refuses(tmp_path):
    marker = tmp_path / "PWNED"
    with pytest.raises(ForbiddenGlobalError) as e:
        check_item(_torch_save(Payload(marker)))
    assert GLOBAL in str(e.value)
    # getattr only names a member of the memory-format enum.
    evil = (b"\x80\x02cbuiltins\ngetattr\ncollections\nOrderedDict\nX\x08\x00\x00\x00fromkeys\x86R.")
    with pytest.raises(ForbiddenGlobalError):
        check_pickle(evil)
    # INST (which names a global too) is refused as an opcode, as in Go.
    with pytest.raises(pickle.UnpicklingError):
        check_pickle(b"\x80\x02(iposix\nsystem\n.")
    # An item that is not a zip archive: torch.load would unpickle it in full.
    with pytest.raises(pickle.UnpicklingError):
        check_item(pickle.dumps(Payload(marker), protocol=2))
    # A memo index far beyond the entries so far (CPython's C unpickler
    # would allocate an array for it).
    with pytest.raises(pickle.UnpicklingError, match="skips ahead"):
        check_pickle(b"\x80\x02Nr\xff\xff\xff\x7f.")
    assert not marker.exists()


def test_allow_list_is_the_go_one():
    """The JSON the Go test TestAllowListMatchesPython compares with globals.go."""
    assert ALLOW_LIST["torch"]["Size"] == "size"
    assert ALLOW_LIST["torch.distributed.checkpoint.metadata"]["Metadata"] == "dcp-class"
    assert "os" not in ALLOW_LIST and "posix" not in ALLOW_LIST

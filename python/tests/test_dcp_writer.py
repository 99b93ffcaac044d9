"""ckptkit.torch.StorageWriter against interrupted overwrites, writers racing
to one URL and the objects an overwrite replaces (docs/TORCH.md, "The DCP
storage layer"), on every backend."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner

import ckptkit
from ckptkit.torch import StorageReader, StorageWriter, encode_integrity
from ckptkit.torch._storage import INTEGRITY_KEY, integrity_key

from conftest import sub_url
from test_dcp import _assert_equal, _state, _zeros_like, ckpt_cli, root_error

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")


def _load(url):
    out = _zeros_like(_state())
    dcp.load(out, storage_reader=StorageReader(url))
    return out


def _committed_keys(url):
    """The keys the committed checkpoint at url references, plus .metadata:
    its data files (storage_data) and its integrity object."""
    ck = ckptkit.torch.Checkpoint(url)
    try:
        md = ck.torch_metadata()
        keys = {i.relative_path for i in md.storage_data.values()}
        return keys | {integrity_key(md.storage_meta.save_id), ".metadata"}
    finally:
        ck.close()


def _keys(url):
    return {o.key for o in ckptkit.Store(url).list()}


class _FailAfterFirstObject(DefaultSavePlanner):
    """A planner whose third item, resolved once a data object of this save
    is stored, raises (or kills the process): a save interrupted after some
    of its data has landed."""

    def __init__(self, url, kill=False, prefix=""):
        super().__init__()
        self.url, self.kill, self.prefix, self.n = url, kill, prefix, 0
        self.before = _keys(url)

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
        self.start = time.time_ns()
        return super().set_up_planner(state_dict, storage_meta, is_coordinator)

    def resolve_data(self, write_item):
        self.n += 1
        if self.n == 3:
            deadline = time.monotonic() + 30
            while not self._data_landed() and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure after the first data object")
        return super().resolve_data(write_item)

    def _data_landed(self):
        # A new data object, or one rewritten under an old name.
        return any(o.key.startswith(self.prefix) and o.key.endswith(".distcp") and (o.key not in self.before or o.mtime_ns > self.start)
                   for o in ckptkit.Store(self.url).list())


# Regression (review): an overwrite deleted the old .metadata only at the
# end, after the new data had replaced the objects it names, so a save
# interrupted in between left the old .metadata committed over new bytes.
def test_interrupted_overwrite_leaves_no_committed_checkpoint(base_url):
    url = sub_url(base_url, "ck")
    dcp.save(_state(1), storage_writer=StorageWriter(url, part_size=4096))
    with pytest.raises(BaseException) as e:  # dcp.CheckpointException is a BaseException
        dcp.save(_state(2), storage_writer=StorageWriter(url, part_size=4096, overwrite=True),
                 planner=_FailAfterFirstObject(url))
    assert "injected failure" in repr(e.value)
    assert ".metadata" not in _keys(url)
    with pytest.raises(BaseException) as e:
        _load(url)
    assert isinstance(root_error(e.value), ckptkit.IncompleteError), repr(e.value)
    if not url.startswith("mem:"):
        r = ckpt_cli("verify", url)
        assert r.returncode == 1 and "never committed" in r.stdout + r.stderr, r.stdout + r.stderr
    # The next overwrite commits and loads what it saved.
    dcp.save(_state(3), storage_writer=StorageWriter(url, overwrite=True))
    _assert_equal(_load(url), _state(3))


def test_overwrite_killed_after_its_first_data_object(file_url, tmp_path):
    url = file_url + "/ck"
    dcp.save(_state(1), storage_writer=StorageWriter(url, part_size=4096))
    script = tmp_path / "die.py"
    script.write_text(
        "import os, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[2])))\n"
        "import torch.distributed.checkpoint as dcp\n"
        "from ckptkit.torch import StorageWriter\n"
        "from test_dcp import _state\n"
        "from test_dcp_writer import _FailAfterFirstObject\n"
        "url = sys.argv[1]\n"
        "dcp.save(_state(2), storage_writer=StorageWriter(url, part_size=4096, overwrite=True),\n"
        "         planner=_FailAfterFirstObject(url, kill=True))\n"
    )
    r = subprocess.run([sys.executable, str(script), url, __file__], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    with pytest.raises(BaseException) as e:
        _load(url)
    assert isinstance(root_error(e.value), ckptkit.IncompleteError), repr(e.value)


class _Turnstile:
    """Runs named steps of several threads in one given order."""

    def __init__(self, steps):
        self.steps, self.i, self.cv = list(steps), 0, threading.Condition()

    def step(self, name, fn):
        with self.cv:
            if not self.cv.wait_for(lambda: self.i < len(self.steps) and self.steps[self.i] == name, timeout=60):
                raise TimeoutError(f"step {name!r} never came (at {self.i} of {self.steps})")
        try:
            return fn()
        finally:
            with self.cv:
                self.i += 1
                self.cv.notify_all()


class _Gated(StorageWriter):
    """A StorageWriter whose plan, data and commit steps wait their turn."""

    def __init__(self, url, gate, name, **kw):
        super().__init__(url, **kw)
        self.gate, self.name = gate, name

    def prepare_local_plan(self, plan):
        return self.gate.step(f"{self.name} plan", lambda: StorageWriter.prepare_local_plan(self, plan))

    def write_data(self, plan, planner):
        return self.gate.step(f"{self.name} write", lambda: StorageWriter.write_data(self, plan, planner))

    def finish(self, metadata, results):
        return self.gate.step(f"{self.name} finish", lambda: StorageWriter.finish(self, metadata, results))


def _race(url, writers, states):
    """Save states[i] with writers[i], each in its own thread, at once;
    returns each save's exception (None when it committed)."""
    errs = [None] * len(writers)
    start = threading.Barrier(len(writers))

    def run(i):
        try:
            start.wait()
            dcp.save(states[i], storage_writer=writers[i])
        except BaseException as e:  # dcp.CheckpointException is a BaseException
            errs[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    return errs


def _check_one_winner(url, errs, states):
    winners = [i for i, e in enumerate(errs) if e is None]
    assert len(winners) == 1, errs
    for i, e in enumerate(errs):
        if e is not None:
            assert isinstance(root_error(e), ckptkit.ConflictError), repr(e)
    _assert_equal(_load(url), states[winners[0]])
    # The losers deleted what they wrote: only the winner's objects remain.
    assert _keys(url) == _committed_keys(url)
    return winners[0]


# Regression (review): object names were fixed, so of two writers that both
# passed the existence check the loser of the .metadata commit could leave
# its data or integrity object in the winner's checkpoint. Both orders of
# the data writes, either writer winning, several rounds each.
@pytest.mark.parametrize("winner", ["A", "B"])
@pytest.mark.parametrize("data_order", ["winner first", "loser first"])
def test_racing_writers_one_commits_bit_identical(base_url, winner, data_order):
    loser = "B" if winner == "A" else "A"
    first, second = (winner, loser) if data_order == "winner first" else (loser, winner)
    for round_ in range(4):
        url = sub_url(base_url, f"ck{round_}")
        gate = _Turnstile(["A plan", "B plan", f"{first} write", f"{second} write", f"{winner} finish", f"{loser} finish"])
        states = [_state(10 + round_), _state(20 + round_)]  # same layout, other values
        errs = _race(url, [_Gated(url, gate, "A", part_size=4096), _Gated(url, gate, "B", part_size=4096)], states)
        assert _check_one_winner(url, errs, states) == "AB".index(winner)
    if url.startswith("file:"):
        out = _zeros_like(_state())
        dcp.load(out, storage_reader=dcp.FileSystemReader(url[len("file://"):]))
        _assert_equal(out, states["AB".index(winner)])
    elif not url.startswith("mem:"):
        r = ckpt_cli("verify", "--deep", url)
        assert r.returncode == 0, r.stdout + r.stderr


def test_writers_racing_freely_one_commits(base_url):
    for round_ in range(12):
        url = sub_url(base_url, f"ck{round_}")
        states = [_state(30 + round_), _state(40 + round_)]
        errs = _race(url, [StorageWriter(url, part_size=4096), StorageWriter(url, part_size=4096)], states)
        _check_one_winner(url, errs, states)


def test_overwrite_removes_what_only_the_replaced_checkpoint_referenced(base_url):
    url = sub_url(base_url, "ck")
    dcp.save(_state(1), storage_writer=StorageWriter(url, part_size=4096))
    old = _committed_keys(url)
    assert len([k for k in old if k.endswith(".distcp")]) > 2
    dcp.save(_state(2), storage_writer=StorageWriter(url, overwrite=True))
    new = _committed_keys(url)
    assert _keys(url) == new and not (old - {".metadata"}) & new
    _assert_equal(_load(url), _state(2))
    if not url.startswith("mem:"):
        r = ckpt_cli("verify", "--deep", url)
        assert r.returncode == 0, r.stdout + r.stderr


def test_overwrite_of_a_legacy_checkpoint(file_url):
    """A checkpoint with the fixed names of before (torch's FileSystemWriter's
    __0_0.distcp, and the .ckptkit-integrity earlier StorageWriters wrote)
    loads through the legacy integrity object, and an overwrite replaces and
    removes it; torch's reader loads the new checkpoint."""
    url = file_url + "/ck"
    path = url[len("file://"):]
    dcp.save(_state(1), storage_writer=dcp.FileSystemWriter(path))
    st = ckptkit.Store(url)
    md = dcp.FileSystemReader(path).read_metadata()
    items = [{"object": i.relative_path, "offset": i.offset, "length": i.length,
              "crc32c": ckptkit.crc32c(st.read(i.relative_path, i.offset, i.length))} for i in md.storage_data.values()]
    st.put(INTEGRITY_KEY, encode_integrity(sorted(items, key=lambda i: (i["object"], i["offset"]))))
    assert sorted(os.listdir(path)) == [INTEGRITY_KEY, ".metadata", "__0_0.distcp"]
    _assert_equal(_load(url), _state(1))
    r = ckpt_cli("verify", "--deep", url)
    assert r.returncode == 0, r.stdout + r.stderr

    dcp.save(_state(2), storage_writer=StorageWriter(url, overwrite=True))
    assert set(os.listdir(path)) == _committed_keys(url)
    assert INTEGRITY_KEY not in os.listdir(path) and "__0_0.distcp" not in os.listdir(path)
    out = _zeros_like(_state())
    dcp.load(out, storage_reader=dcp.FileSystemReader(path))
    _assert_equal(out, _state(2))


def test_failed_cleanup_is_logged_and_the_save_stands(file_url, caplog, monkeypatch):
    url = file_url + "/ck"
    path = url[len("file://"):]
    dcp.save(_state(1), storage_writer=StorageWriter(url, part_size=4096))
    old = sorted(k for k in os.listdir(path) if k.endswith(".distcp"))
    # The storage refuses to delete one object of the replaced checkpoint.
    real_delete = ckptkit.Store.delete

    def delete(store, key):
        if key == old[0]:
            raise ckptkit.TransientError(f"{store.object_url(key)}: injected delete failure")
        return real_delete(store, key)

    monkeypatch.setattr(ckptkit.Store, "delete", delete)
    with caplog.at_level("WARNING", logger="ckptkit"):
        dcp.save(_state(2), storage_writer=StorageWriter(url, overwrite=True))
    _assert_equal(_load(url), _state(2))
    assert any(old[0] in r.getMessage() and "could not delete" in r.getMessage() for r in caplog.records), caplog.text
    left = os.listdir(path)
    assert old[0] in left and not any(k in left for k in old[1:])


def test_ckpt_gc_expires_dcp_checkpoints_storage_writer_wrote(file_url):
    """gc expires the DCP checkpoints StorageWriter wrote (every object is
    named for its save) by the same policy as native ones: --keep-last 1
    deletes steps 1 and 2 whole and leaves every object of step 3, which
    still loads."""
    run = file_url + "/run"
    for step in (1, 2, 3):
        dcp.save(_state(step), storage_writer=StorageWriter(f"{run}/step-{step:08d}", part_size=4096))
    before = _keys(f"{run}/step-00000003")
    r = ckpt_cli("gc", run, "--keep-last", "1", "--grace", "0s")
    assert r.returncode == 0, r.stdout + r.stderr
    for step in (1, 2):
        assert _keys(f"{run}/step-{step:08d}") == set()
    assert _keys(f"{run}/step-00000003") == before
    _assert_equal(_load(f"{run}/step-00000003"), _state(3))


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_overwrite_on_two_ranks(backend, tmp_path):
    """On 2 gloo ranks: the coordinator uncommits the old checkpoint before
    any rank writes, so a job killed during an overwrite (rank 1 SIGKILLed
    after its first data object) leaves no committed checkpoint; the next
    overwrite commits one tag for both ranks' objects and leaves only
    them. (A rank raising instead hangs torch 2.6 on Python 3.13: its
    wrapped exception holds code objects that gather_object cannot pickle.)"""
    from test_dist import WORKER, run

    if backend == "file":
        url = "file://" + str(tmp_path / "ck")
    else:
        base = os.environ.get("CKPTKIT_TEST_S3_URL")
        if not base:
            if os.environ.get("CI") == "true":
                pytest.fail("CKPTKIT_TEST_S3_URL is not set")
            pytest.skip("CKPTKIT_TEST_S3_URL not set")
        url = sub_url(base, f"dist-{os.getpid()}-{tmp_path.name}")
    r = subprocess.run([sys.executable, WORKER, "dcp-overwrite-killed", "2", url, str(tmp_path / "killed")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "-9]" in r.stdout + r.stderr, r.stdout + r.stderr
    left = _keys(url)
    assert ".metadata" not in left and any(k.startswith("__1_") for k in left), left
    with pytest.raises(BaseException) as e:
        _load(url)
    assert isinstance(root_error(e.value), ckptkit.IncompleteError), repr(e.value)
    out = run("dcp-overwrite", 2, url, tmp_path / "out")
    # What the killed job left is no committed checkpoint's: it stays
    # (docs/TORCH.md); the replaced checkpoint's objects went uncommitted
    # with it.
    assert set(out["keys"]) == set(out["committed"]) | left, out
    tags = {k.split(".")[1] for k in out["committed"] if k.endswith(".distcp")}
    assert len(tags) == 1 and {k[:4] for k in out["committed"] if k.endswith(".distcp")} == {"__0_", "__1_"}, out
    assert out["equal"], out


def test_lost_integrity_object_is_refused_not_loaded_unchecked(file_url):
    """Regression (review): a checkpoint StorageWriter wrote whose integrity
    object is gone (deleted, or left out of a copy) used to be taken for one
    torch wrote and loaded without any CRC32C check. Its data objects are
    named for the committing save, so ckptkit knows it wrote an integrity
    object: the Python reader and the Go one (ckpt verify, resume) refuse
    it as a bad checkpoint."""
    url = file_url + "/ck"
    dcp.save(_state(1), storage_writer=StorageWriter(url))
    ck = ckptkit.torch.Checkpoint(url)
    try:
        key = integrity_key(ck.torch_metadata().storage_meta.save_id)
    finally:
        ck.close()
    assert key != INTEGRITY_KEY
    ckptkit.Store(url).delete(key)
    with pytest.raises(BaseException) as ei:  # dcp.CheckpointException is a BaseException
        _load(url)
    err = root_error(ei.value)
    assert isinstance(err, ckptkit.BadCheckpointError) and "integrity object missing" in str(err), repr(err)
    for args in (("verify", url), ("verify", "--deep", url)):
        r = ckpt_cli(*args)
        assert r.returncode != 0 and "integrity object missing" in r.stdout + r.stderr, r.stdout + r.stderr
    # torch's own reader, which checks nothing, still reads it.
    out = _zeros_like(_state())
    dcp.load(out, storage_reader=dcp.FileSystemReader(url[len("file://"):]))
    _assert_equal(out, _state(1))

"""Asynchronous saves: ckptkit.torch.save(..., async_save=True) through the Go
core's saver (staging within its budget, a background write, the metadata
committed last), and torch's dcp.async_save through StorageWriter."""

import contextlib
import os
import resource
import signal
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import AsyncSave, StorageReader, StorageWriter, resume, save, step_url
from ckptkit.torch import _async

from conftest import sub_url
from models import make, snapshot, train
from test_dcp import _assert_equal, _state, _zeros_like

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")


def _bits(t):
    """The tensor's bytes, for bit-exact comparisons (NaN included)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _trained_with_ballast(mib):
    m, opt, sched = make()
    train(m, opt, sched, 3)
    g = torch.Generator().manual_seed(11)
    ballast = torch.randn(mib << 18, generator=g)  # mib MiB of float32
    return m, opt, sched, ballast


def _mutate_everything(m, opt, ballast):
    with torch.no_grad():
        for t in m.state_dict().values():
            t.add_(1.0)
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    v.mul_(3.0).add_(1.0)
        ballast.neg_()


def _check_resumes_to(url, want, want_ballast):
    m2, opt2, sched2 = make(seed=9)
    got_ballast = {"ballast": torch.zeros_like(want_ballast)}
    rep = resume(url, m2, opt2, scheduler=sched2, extra_state=got_ballast)
    got = snapshot(m2, opt2)
    assert rep.step == 3 and rep.optimizer_loaded
    # Optimizer state is keyed by id(param): compare in parameter order.
    assert [k for k in got if k[0] == "model"] == [k for k in want if k[0] == "model"]
    for k in want:
        if k[0] == "model":
            assert _bits(got[k]) == _bits(want[k]), k
    wopt = [v for k, v in want.items() if k[0] == "opt"]
    gopt = [v for k, v in got.items() if k[0] == "opt"]
    assert len(wopt) == len(gopt) and all(_bits(a) == _bits(b) for a, b in zip(wopt, gopt))
    assert _bits(got_ballast["ballast"]) == _bits(want_ballast)
    return rep


@pytest.mark.parametrize("mode", [True, "blocking"], ids=["overlap", "blocking"])
def test_async_save_then_mutating_every_tensor_commits_the_pre_mutation_values(base_url, mode):
    m, opt, sched, ballast = _trained_with_ballast(24)
    want, want_ballast = snapshot(m, opt), ballast.clone()
    h = save(base_url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=mode)
    assert isinstance(h, AsyncSave)
    if mode == "blocking":
        assert h.staged.done() and h.status in ("staged", "committed")
    else:
        h.wait_staged()
        assert h.staged.result() is None and h.status in ("staged", "committed")
    # The state is staged: change every tensor at once, while it is written.
    _mutate_everything(m, opt, ballast)
    assert h.wait() == step_url(base_url, 3)
    assert h.done() and h.status == "committed" and h.result["bytes_written"] > 24 << 20
    _check_resumes_to(base_url, want, want_ballast)


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_budget_smaller_than_the_state_completes_within_it(file_url):
    budget = 2 << 20
    m, opt, sched, ballast = _trained_with_ballast(48)
    want, want_ballast = snapshot(m, opt), ballast.clone()
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.wait(0.001):
            peak[0] = max(peak[0], _rss())

    base = _rss()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        h = save(file_url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True,
                 staging_bytes=budget)
        h.wait_staged()
        _mutate_everything(m, opt, ballast)
        h.wait()
    finally:
        stop.set()
        sampler.join()
    stats = _async.current_saver().stats()
    assert stats["budget_bytes"] <= budget
    assert 0 < stats["peak_bytes"] <= budget and stats["pool_bytes"] <= budget
    # Measured: the process grew by the budget plus the Go runtime's own
    # needs, never by the 48 MiB state (the bound: budget + 64 MiB).
    assert peak[0] - base <= budget + (64 << 20), f"RSS grew {(peak[0] - base) >> 20} MiB"
    _check_resumes_to(file_url, want, want_ballast)


@contextlib.contextmanager
def _file_size_limit(n):
    """Writes beyond n bytes of a file fail with EFBIG in this process (the
    Go core's too), even as root: a disk that refuses the data objects."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    prev = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, prev)


def test_failed_background_write_surfaces_on_wait_and_on_the_next_save_and_commits_nothing(file_url):
    m, opt, sched, ballast = _trained_with_ballast(64)
    with _file_size_limit(40 << 20):
        # Planned and staged (the metadata check reads only), so save
        # returns; the data object is refused in the background, 40 MiB
        # into its write.
        h = save(file_url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True)
        with pytest.raises(ckptkit.CheckpointError) as e:
            h.wait()
        assert "step-00000003" in str(e.value) and "file too large" in str(e.value)
        assert h.status == "failed" and h.done()
        with pytest.raises(type(e.value)):  # wait() does not consume it
            h.wait()
        # The next save reports it instead of starting.
        with pytest.raises(type(e.value)) as nxt:
            save(file_url, m, opt, step=4, scheduler=sched, async_save=True)
        assert "previous save failed" in str(nxt.value) and "step-00000003" in str(nxt.value)
    # The one after runs; nothing of step 3 was committed.
    save(file_url, m, opt, step=4, scheduler=sched, extra_state={"ballast": ballast}, async_save=True).wait()
    path = file_url[len("file://"):]
    assert not os.path.exists(os.path.join(path, "step-00000003", ".metadata"))
    rep = resume(file_url, *make(seed=2)[:2], extra_state={"ballast": torch.zeros_like(ballast)})
    assert rep.step == 4 and rep.url.endswith("step-00000004")


def test_a_synchronous_save_reports_a_failed_background_save(file_url):
    m, opt, sched, ballast = _trained_with_ballast(64)
    with _file_size_limit(40 << 20):
        h = save(file_url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True)
        with pytest.raises(ckptkit.CheckpointError, match="previous save failed"):
            save(file_url, m, opt, step=4, scheduler=sched)
    assert h.status == "failed"
    assert not os.path.exists(os.path.join(file_url[len("file://"):], "step-00000004"))
    assert save(file_url, m, opt, step=4, scheduler=sched) == step_url(file_url, 4)


def test_s3_bucket_that_refuses_the_write():
    base = os.environ.get("CKPTKIT_TEST_S3_URL")
    if not base:
        pytest.skip("CKPTKIT_TEST_S3_URL not set (start the servers: scripts/test-servers.sh)")
    # The same server, a bucket that does not exist: the commit check finds
    # no checkpoint, the data writes are refused.
    scheme, rest = base.split("://", 1)
    _, _, tail = rest.partition("/")
    url = f"{scheme}://no-such-bucket-ckptkit/{tail.split('?')[0]}{'?' + base.split('?', 1)[1] if '?' in base else ''}"
    m, opt, sched = make()
    train(m, opt, sched, 1)
    try:
        h = save(url, m, opt, step=1, scheduler=sched, async_save=True)
    except ckptkit.CheckpointError as e:  # refused before it was staged
        err = e
    else:
        with pytest.raises(ckptkit.CheckpointError) as e:
            h.wait()
        err = e.value
        with pytest.raises(type(err)):
            save(url, m, opt, step=2, scheduler=sched, async_save=True)
    assert "no-such-bucket-ckptkit" in str(err)
    assert isinstance(err, (ckptkit.NotFoundError, ckptkit.AccessError, ckptkit.UsageError))


def test_dcp_async_save_round_trip(base_url):
    url = sub_url(base_url, "ck")
    sd = _state(5)
    want = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in sd.items()}
    want["nested"] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in sd["nested"].items()}
    fut = dcp.async_save(sd, storage_writer=StorageWriter(url))
    # Staged before async_save returned: the caller may change its tensors.
    with torch.no_grad():
        sd["w"].add_(1.0)
        sd["nested"]["x"].zero_()
    fut.result()
    out = _zeros_like(want)
    dcp.load(out, storage_reader=StorageReader(url))
    want["view"] = want["view"].contiguous()
    _assert_equal(out, want)


def test_ckpt_diff_of_the_same_state_saved_sync_and_async_is_equal(base_url):
    """The same training state saved as DCP (sync) and in the native format
    (async_save) diffs equal: non-tensor values (param groups, scheduler,
    step) are compared as values (0 and 0.0 alike), tensors bit for bit;
    one changed hyper-parameter makes it differ, naming the key."""
    from test_dcp import ckpt_cli

    if base_url.startswith("mem://"):
        pytest.skip("mem:// lives in this process; the ckpt CLI is another one")
    m, opt, sched = make()
    train(m, opt, sched, 3)
    sync = save(sub_url(base_url, "sync"), m, opt, step=3, scheduler=sched)
    asy = save(sub_url(base_url, "async"), m, opt, step=3, scheduler=sched, async_save=True).wait()
    r = ckpt_cli("diff", sync, asy)
    assert r.returncode == 0, r.stdout + r.stderr
    opt.param_groups[0]["weight_decay"] = 0.5
    other = save(sub_url(base_url, "other"), m, opt, step=3, scheduler=sched, async_save=True).wait()
    r = ckpt_cli("diff", sync, other)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "optimizer.param_groups.0.weight_decay" in r.stdout

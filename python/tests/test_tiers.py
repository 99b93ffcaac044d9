"""Tiered runs from Python (save/resume with local=): 2 gloo ranks, each
with its own node-local tier in a temporary directory, the durable run on
the S3 test server. Resume takes the local tier; past a damaged local copy
both ranks take an older local step together; with one node's local tier
gone both resume from the durable run; after every rank was SIGKILLed with
a persist in flight, from the local tier, or the newest durable step that
committed; every path ends bit-identical to the straight run."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest
import torch

import ckptkit
import ckptkit.torch as ct
from conftest import sub_url
from models import make, train

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tier_worker.py")


def run(scenario, url, local_dir, out):
    r = subprocess.run([sys.executable, WORKER, scenario, "2", url, str(local_dir), str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    if scenario == "killed":
        return None  # no rank lived to write results
    return torch.load(os.path.join(out, "result.pt"), weights_only=False)


def s3_url():
    base = os.environ.get("CKPTKIT_TEST_S3_URL")
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail("CKPTKIT_TEST_S3_URL is not set")
        pytest.skip("CKPTKIT_TEST_S3_URL not set (start the servers: scripts/test-servers.sh)")
    return sub_url(base, f"tiers-{uuid.uuid4().hex[:12]}")


def remove_all(url):
    with ckptkit.Store(url) as st:
        for o in st.list(""):
            st.delete(o.key)


def committed(url):
    """The steps committed under a run (listing it through the Go core)."""
    with ckptkit.Store(url) as st:
        keys = [o.key for o in st.list("")]
    return sorted({int(k.split("/")[0][5:]) for k in keys if k.startswith("step-") and k.endswith("metadata.json")})


def bit_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if torch.is_tensor(a[k]):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def damage(step_dir):
    """Flip one byte in the middle of the step's largest data object."""
    files = [os.path.join(step_dir, f) for f in os.listdir(step_dir) if not f.endswith(".json")]
    big = max(files, key=os.path.getsize)
    with open(big, "r+b") as f:
        f.seek(os.path.getsize(big) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def test_two_ranks_resume_from_the_nearest_tier_bit_identical(tmp_path):
    url = s3_url()
    local = tmp_path / "nodes"
    try:
        saved = run("save", url, local, tmp_path / "save")
        straight = saved[0]["state"]
        bit_identical(straight, saved[1]["state"])  # DDP: replicated state
        assert "async_save" in saved[0]["async_refused"]
        # Every rank commits 2, 4, 6 locally (keeping 2); rank 0 alone
        # persists, every 4th step.
        for rank in (0, 1):
            assert committed("file://" + str(local / f"rank-{rank}")) == [4, 6]
        assert committed(url) == [4]

        got = run("resume", url, local, tmp_path / "local")
        for r in got:
            assert (r["tier"], r["step"]) == ("local", 6), r["tier_why"]
            bit_identical(straight, r["state"])

        # Rank 1's local copy of step 6 damaged: both ranks take local step 4.
        damage(str(local / "rank-1" / "step-00000006"))
        got = run("resume", url, local, tmp_path / "damaged")
        for rank, r in enumerate(got):
            assert (r["tier"], r["step"]) == ("local", 4), r["tier_why"]
            assert [(u.endswith("step-00000006"), why) for u, why in r["skipped"]] == [
                (True, "damaged" if rank == 1 else "other-rank")], r["skipped"]
            bit_identical(straight, r["state"])

        # Rank 1's node lost: both ranks resume from the durable step 4.
        shutil.rmtree(local / "rank-1")
        got = run("resume", url, local, tmp_path / "durable")
        for r in got:
            assert (r["tier"], r["step"]) == ("durable", 4), r["tier_why"]
            bit_identical(straight, r["state"])
    finally:
        if url.startswith("s3://"):
            remove_all(url)


def test_two_ranks_sigkilled_mid_persist_resume_from_the_nearest_tier_bit_identical(tmp_path):
    # The job dies (every rank SIGKILLed) right after the local commit of
    # step 8, with rank 0's persist of it in flight: the resume takes the
    # local step 8; with one node's local tier gone, the newest durable
    # step that committed (4, persisted before; 8 only if its persist ended
    # before the kill, never a half-persisted one); both end as the
    # straight run.
    url = s3_url()
    local = tmp_path / "nodes"
    try:
        straight = run("save", sub_url(url, "straight"), tmp_path / "straight-nodes", tmp_path / "save")[0]["state"]
        run("killed", url, local, tmp_path / "killed")
        for rank in (0, 1):
            assert committed("file://" + str(local / f"rank-{rank}"))[-2:] == [6, 8]
        durable = committed(url)
        assert durable in ([4], [4, 8]), durable  # step 8's persist was cut, or had just ended

        got = run("resume", url, local, tmp_path / "local")
        for r in got:
            assert (r["tier"], r["step"]) == ("local", 8), r["tier_why"]
            bit_identical(straight, r["state"])

        shutil.rmtree(local / "rank-1")
        got = run("resume", url, local, tmp_path / "durable")
        for r in got:
            assert (r["tier"], r["step"]) == ("durable", max(durable)), r["tier_why"]
            bit_identical(straight, r["state"])
    finally:
        if url.startswith("s3://"):
            remove_all(url)


def test_one_process_tiered_save_and_resume(tmp_path):
    """Without a process group: the local tier commits, the durable copy
    follows; resume says which tier and why; what a tiered save does not
    take is refused naming the option."""
    run_url, local = "file://" + str(tmp_path / "durable"), "file://" + str(tmp_path / "local")
    m, opt, sched = make(0)
    train(m, opt, sched, 2)
    assert ct.save(run_url, m, opt, step=2, scheduler=sched, local=local).endswith("step-00000002")
    ct.close()
    assert committed(run_url) == [2] and committed(local) == [2]
    with pytest.raises(ckptkit.UsageError, match="persist_every"):
        ct.save(run_url, m, opt, step=3, scheduler=sched, persist_every=2)
    with pytest.raises(ckptkit.UsageError, match="local_keep"):
        ct.save(run_url, m, opt, step=3, scheduler=sched, local=local, local_keep=0)

    m2, opt2, sched2 = make(1)
    rep = ct.resume(run_url, m2, opt2, scheduler=sched2, local=local)
    assert (rep.tier, rep.step) == ("local", 2), rep.tier_why
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    shutil.rmtree(tmp_path / "local")
    rep = ct.resume(run_url, m2, opt2, scheduler=sched2, local=local)
    assert (rep.tier, rep.step) == ("durable", 2), rep.tier_why
    assert rep.tier_why
    assert ct.resume(run_url, m2, opt2, scheduler=sched2).tier is None


def test_a_failed_persist_is_raised_never_dropped(tmp_path):
    """A persist that fails (a file where the durable step's prefix goes)
    leaves the local commit standing and is raised by close(), never
    dropped."""
    durable = tmp_path / "durable"
    durable.mkdir()
    (durable / "step-00000001").write_text("in the way")
    run_url, local = "file://" + str(durable), "file://" + str(tmp_path / "local")
    m, opt, sched = make(0)
    assert ct.save(run_url, m, opt, step=1, scheduler=sched, local=local).endswith("step-00000001")
    assert committed(local) == [1]
    with pytest.raises(ckptkit.CheckpointError, match="persist step 1"):
        ct.close()
    ct.close()  # reported once: the run is released

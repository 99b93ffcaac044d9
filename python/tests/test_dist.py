"""Two gloo ranks on CPU: DTensor-sharded state (the FSDP2 layout) and DDP,
saved with ckptkit.torch.save and resumed on 2 ranks and on 1."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import sub_url

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")


def run(scenario, world, url, out):
    r = subprocess.run([sys.executable, WORKER, scenario, str(world), url, str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.load(os.path.join(out, "result.pt"), weights_only=False)


def _equal(a, b, keys):
    for k in keys:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_dtensor_sharded_state_resumes_on_2_and_1_ranks(backend, tmp_path):
    if backend == "file":
        url = "file://" + str(tmp_path / "run")
    else:
        base = os.environ.get("CKPTKIT_TEST_S3_URL")
        if not base:
            pytest.skip("CKPTKIT_TEST_S3_URL not set")
        url = sub_url(base, f"dist-{os.getpid()}-{tmp_path.name}")
    saved = run("dtensor-save", 2, url, tmp_path / "save")
    lazy = sorted(f"experts.1.{w}.{p}" for w in ("w_in", "w_out") for p in ("weight", "bias"))
    assert not any(k.startswith("optim.experts.1.") for k in saved)
    two = run("dtensor-resume", 2, url, tmp_path / "r2")
    assert two["step"] == 3 and two["lazy"] == lazy and two["lr"] == saved["lr"]
    keys = [k for k in saved if k.startswith(("model.", "optim."))]
    _equal(saved, two, keys)
    one = run("resume-plain", 1, url, tmp_path / "r1")
    assert one["step"] == 3 and one["lazy"] == lazy and one["lr"] == saved["lr"]
    _equal(saved, one, keys)


def test_fsdp2_fully_shard_saves_on_2_ranks_and_resumes_on_2_and_1(tmp_path):
    """FSDP2 itself (fully_shard on a CPU gloo mesh), where the torch build
    runs it (a feature test in the worker: torch 2.6's does not)."""
    url = "file://" + str(tmp_path / "run")
    saved = run("fsdp2-save", 2, url, tmp_path / "save")
    if "unsupported" in saved:
        pytest.skip(saved["unsupported"])
    lazy = sorted(f"experts.1.{w}.{p}" for w in ("w_in", "w_out") for p in ("weight", "bias"))
    assert not any(k.startswith("optim.experts.1.") for k in saved)
    keys = [k for k in saved if k.startswith(("model.", "optim."))]
    two = run("fsdp2-resume", 2, url, tmp_path / "r2")
    assert two["step"] == 3 and two["lazy"] == lazy and two["lr"] == saved["lr"]
    _equal(saved, two, keys)
    one = run("resume-plain", 1, url, tmp_path / "r1")
    assert one["step"] == 3 and one["lazy"] == lazy and one["lr"] == saved["lr"]
    _equal(saved, one, keys)


def test_ddp_resumes_on_2_and_1_ranks(tmp_path):
    url = "file://" + str(tmp_path / "run")
    saved = run("ddp-save", 2, url, tmp_path / "save")
    two = run("ddp-resume", 2, url, tmp_path / "r2")
    keys = [k for k in saved if k.startswith(("model.", "optim."))]
    assert two["step"] == 3
    _equal(saved, two, keys)
    one = run("resume-plain", 1, url, tmp_path / "r1")
    _equal(saved, one, keys)


def test_async_sharded_save_and_a_fallback_on_one_rank_agree(tmp_path):
    """2 ranks save DTensor shards asynchronously (steps 3 and 6); a byte of
    a shard only rank 1 reads is damaged in step 6: rank 1 falls back to
    step 3, and rank 0, whose shards of step 6 are intact, reloads step 3
    too, so both resume at step 3 with the step-3 state."""
    import json

    url = "file://" + str(tmp_path / "run")
    saved = run("dtensor-save-async", 2, url, tmp_path / "save")
    ck = tmp_path / "run" / "step-00000006"
    md = json.loads((ck / "ckptkit.metadata.json").read_text())
    (chunk,) = [c for t in md["tensors"] if t["key"] == "model.head.weight" for c in t["chunks"] if c["offsets"][0] > 0]
    with open(ck / chunk["object"], "r+b") as f:
        f.seek(chunk["offset"] + 1)
        b = f.read(1)
        f.seek(chunk["offset"] + 1)
        f.write(bytes([b[0] ^ 0x20]))
    two = run("dtensor-resume", 2, url, tmp_path / "r2")
    assert two["step"] == 3 and two["lr"] == saved["lr"]
    # Rank 0's own shards of step 6 were intact: it loaded them, then
    # reloaded step 3 for the agreement.
    assert [(u.endswith("step-00000006"), r) for u, r in two["skipped"]] == [
        (True, "another rank could not load it and fell back to step-00000003")], two["skipped"]
    _equal(saved, two, [k for k in saved if k.startswith(("model.", "optim."))])

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


def test_ddp_resumes_on_2_and_1_ranks(tmp_path):
    url = "file://" + str(tmp_path / "run")
    saved = run("ddp-save", 2, url, tmp_path / "save")
    two = run("ddp-resume", 2, url, tmp_path / "r2")
    keys = [k for k in saved if k.startswith(("model.", "optim."))]
    assert two["step"] == 3
    _equal(saved, two, keys)
    one = run("resume-plain", 1, url, tmp_path / "r1")
    _equal(saved, one, keys)

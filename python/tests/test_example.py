"""The examples/torch MoE trainer: SIGKILL mid-run and resume (2 -> 2 and
2 -> 1 ranks) ends bit-identical to an uninterrupted run; --no-save-optim and
--no-load-optim keep the step and the LR schedule."""

import os
import re
import subprocess

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch")


@pytest.mark.parametrize("flags", [[], ["--async"]], ids=["sync", "async"])
def test_kill_and_resume_is_bit_identical(tmp_path, flags):
    r = subprocess.run(["bash", os.path.join(EXAMPLES, "kill_and_resume.sh"), "file://" + str(tmp_path), *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 -> 2: bit-identical" in r.stdout and "2 -> 1: bit-identical" in r.stdout, r.stdout
    assert re.search(r"resumed \S+step-00000003 at step 3 .*lazy: [1-9]", r.stderr), r.stderr
    if flags:
        assert re.search(r"step\s+12 .* saving \S+step-00000012", r.stderr) and "committed" in r.stderr, r.stderr


def test_async_run_is_bit_identical_to_a_sync_run(tmp_path):
    digest = re.compile(r"weights sha256 ([0-9a-f]{64})")
    sync = _train("file://" + str(tmp_path / "sync"))
    asy = _train("file://" + str(tmp_path / "async"), "--async", "--staging-bytes", str(1 << 20))
    assert sync.returncode == 0 and asy.returncode == 0, sync.stderr + asy.stderr
    assert digest.search(sync.stdout).group(1) == digest.search(asy.stdout).group(1)
    assert _lrs(sync.stdout) == _lrs(asy.stdout)


def _train(url, *flags):
    r = subprocess.run(["python3", os.path.join(EXAMPLES, "moe_train.py"), "--url", url, "--world", "1",
                        "--steps", "8", "--save-every", "3", *flags], capture_output=True, text=True, timeout=300)
    return r


def _lrs(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step\s+(\d+)\s+lr (\S+)", out)}


@pytest.mark.parametrize("flag", ["--no-save-optim", "--no-load-optim"])
def test_without_optimizer_step_and_lr_schedule_are_kept(tmp_path, flag):
    ref = _train("file://" + str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    url = "file://" + str(tmp_path / "run")
    killed = _train(url, "--kill-at", "4", *( [flag] if flag == "--no-save-optim" else []))
    assert killed.returncode == 137, killed.stdout + killed.stderr
    resumed = _train(url, flag)
    assert resumed.returncode == 0, resumed.stderr
    assert "at step 3" in resumed.stdout and "optimizer loaded: False" in resumed.stdout, resumed.stdout
    steps = _lrs(resumed.stdout)
    assert min(steps) == 4  # continues after the checkpoint's step
    want = _lrs(ref.stdout)
    assert all(want[s] == lr for s, lr in steps.items()), (steps, want)

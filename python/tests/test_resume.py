"""ckptkit.torch.save / resume: the resume rules of docs/RESUME.md, on torch
2.6, through the Go loader."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageWriter, resume, save, step_url

from conftest import fixtures_dir, sub_url
from models import make, same, same_bits, snapshot, train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")

EXPERT1 = [f"experts.1.{w}.{p}" for w in ("w_in", "w_out") for p in ("weight", "bias")]


def _trained(steps=3, route=0):
    m, opt, sched = make()
    train(m, opt, sched, steps, route=route)
    return m, opt, sched


def _train_on_identically(m, opt, sched, m2, opt2, sched2):
    """The weights agree now, and after training on from both ends."""
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    train(m, opt, sched, 2, seed=5)
    train(m2, opt2, sched2, 2, seed=5)
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)


def test_save_and_resume_on_every_backend(base_url):
    m, opt, sched = _trained()
    url = save(base_url, m, opt, step=3, scheduler=sched)
    assert url == sub_url(base_url, "step-00000003")
    m2, opt2, sched2 = make(seed=7)
    rep = resume(base_url, m2, opt2, scheduler=sched2)
    assert rep.step == 3 and rep.optimizer_loaded
    for (a, b) in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(m.parameters(), m2.parameters()):
        assert opt.state[p].keys() == opt2.state[q].keys()
        for k in opt.state[p]:
            assert torch.equal(opt.state[p][k], opt2.state[q][k]), k
    assert sched2.last_epoch == sched.last_epoch
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    _train_on_identically(m, opt, sched, m2, opt2, sched2)


def test_fresh_run_resumes_to_none(base_url, caplog):
    """Nothing under a run URL: None (a fresh start, logged), or
    NotFoundError with must_exist=True; a checkpoint URL under which
    nothing is stored (a typo) always raises NotFoundError, on every
    backend; nothing is modified."""
    m, opt, sched = make()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with caplog.at_level("INFO", logger="ckptkit"):
        assert resume(base_url, m, opt, scheduler=sched) is None
    assert any("fresh start: nothing under" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(ckptkit.NotFoundError, match="nothing is stored there"):
        resume(base_url, m, opt, scheduler=sched, must_exist=True)
    train(m, opt, sched, 3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    save(sub_url(base_url, "run"), m, opt, step=3, scheduler=sched)
    for typo in (sub_url(base_url, "run", "step-00000099"), sub_url(base_url, "runn", "step-00000003")):
        with pytest.raises(ckptkit.NotFoundError, match="nothing is stored there"):
            resume(typo, m, opt, scheduler=sched)
    assert resume(sub_url(base_url, "run"), m, opt, scheduler=sched, must_exist=True).step == 3
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_lazily_absent_state_is_pruned_and_reported(file_url, caplog):
    m, opt, sched = _trained(route=0)  # expert 1 never gets a token
    assert all(p not in opt.state for n, p in m.named_parameters() if n.startswith("experts.1."))
    save(file_url, m, opt, step=3, scheduler=sched)
    m2, opt2, sched2 = make(seed=3)
    with caplog.at_level("INFO", logger="ckptkit"):
        rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert sorted(rep.lazy_params) == sorted(EXPERT1)
    names = dict(m2.named_parameters())
    for n in EXPERT1:
        assert names[n] not in opt2.state  # fresh, exactly as never stepped
    assert len([r for r in caplog.records if "4 parameters had no optimizer state" in r.getMessage()]) == 1


def _save_custom(url, m, opt, sched, step, mutate):
    """Save the layout ckptkit.torch.save writes, with mutate applied to the
    optimizer state first (to make corrupt or foreign checkpoints)."""
    from ckptkit.torch import _optimizer_state

    osd = _optimizer_state(m, opt)
    mutate(osd)
    sd = {"model": m.state_dict(), "optimizer": osd, "scheduler": sched.state_dict(), "step": step}
    dcp.save(sd, storage_writer=StorageWriter(step_url(url, step), optimizer="saved"))


def test_partial_state_is_refused_before_anything_changes(file_url):
    m, opt, sched = _trained()
    _save_custom(file_url, m, opt, sched, 3, lambda osd: osd["state"]["embed.bias"].pop("exp_avg_sq"))
    m2, opt2, sched2 = _trained(steps=1)
    before = snapshot(m2, opt2)
    lr, epoch = opt2.param_groups[0]["lr"], sched2.last_epoch
    # By the checkpoint URL (the loader's rules) and by the run URL (the
    # choice of the newest valid checkpoint, none here).
    for url in (step_url(file_url, 3), file_url):
        with pytest.raises(ckptkit.PartialStateError) as e:
            resume(url, m2, opt2, scheduler=sched2)
        msg = str(e.value)
        assert "embed.bias" in msg and "optimizer.state.embed.bias.exp_avg_sq" in msg
        assert isinstance(e.value, ckptkit.CheckpointError) and e.value.cls == ckptkit.errors.BAD_CHECKPOINT
        assert same(before, snapshot(m2, opt2))
        assert (lr, epoch) == (opt2.param_groups[0]["lr"], sched2.last_epoch)


def test_renamed_optimizer_prefix_is_a_layout_mismatch(file_url):
    m, opt, sched = _trained()

    def rename(osd):
        osd["state"] = {"module." + k: v for k, v in osd["state"].items()}
        for g in osd["param_groups"]:
            g["params"] = ["module." + p for p in g["params"]]

    _save_custom(file_url, m, opt, sched, 3, rename)
    m2, opt2, sched2 = make(seed=4)
    before = snapshot(m2, opt2)
    for url in (step_url(file_url, 3), file_url):
        with pytest.raises(ckptkit.LayoutMismatchError) as e:
            resume(url, m2, opt2, scheduler=sched2)
        assert "module.embed" in str(e.value)
        assert same(before, snapshot(m2, opt2))


def test_save_without_optimizer_keeps_step_and_lr(file_url):
    m, opt, sched = _trained(steps=5)
    save(file_url, m, opt, step=5, scheduler=sched, save_optimizer=False)
    m2, opt2, sched2 = make(seed=9)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 5 and not rep.optimizer_loaded
    assert sched2.last_epoch == sched.last_epoch
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == sched.get_last_lr()[0]
    assert not opt2.state  # fresh
    for a, b in zip(m.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)


def test_load_without_optimizer_keeps_step_and_lr(file_url):
    m, opt, sched = _trained(steps=5)
    save(file_url, m, opt, step=5, scheduler=sched)
    m2, opt2, sched2 = make(seed=9)
    rep = resume(file_url, m2, opt2, scheduler=sched2, load_optimizer=False)
    assert rep.step == 5 and not rep.optimizer_loaded
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert sched2.last_epoch == sched.last_epoch
    assert not opt2.state


def test_newest_committed_checkpoint_is_chosen_and_killed_save_skipped(file_url, tmp_path):
    m, opt, sched = _trained()
    save(file_url, m, opt, step=3, scheduler=sched)
    # A save killed with SIGKILL after its data and before its commit.
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, sys, torch, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[2])))\n"
        "import ckptkit.torch as ct\n"
        "from models import make, train\n"
        "class Dying(ct.StorageWriter):\n"
        "    def finish(self, metadata, results):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "ct.StorageWriter = Dying\n"
        "m, opt, sched = make(); train(m, opt, sched, 4)\n"
        "ct.save(sys.argv[1], m, opt, step=4, scheduler=sched)\n"
    )
    r = subprocess.run([sys.executable, str(script), file_url, __file__], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = os.listdir(file_url[len("file://"):] + "/step-00000004")
    assert left and ".metadata" not in left and any(n.endswith(".distcp") for n in left)
    m2, opt2, sched2 = make(seed=2)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 3 and rep.url.endswith("step-00000003")
    assert any("step-00000004" in s["url"] and "uncommitted" in s["reason"] for s in rep.skipped)
    from test_dcp import ckpt_cli

    out = ckpt_cli("latest", file_url)
    assert out.returncode == 0 and "step-00000003" in out.stdout, out.stdout + out.stderr


def test_unreadable_checkpoint_is_skipped_and_never_a_fresh_start(file_url, tmp_path):
    """Issue 30: a step directory this process may not read (mode 000, run
    without CAP_DAC_OVERRIDE: root bypasses permissions) made resume fail
    outright. It is skipped with its reason; with nothing readable left,
    resume raises AccessError instead of starting over."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    m, opt, sched = _trained()
    save(file_url, m, opt, step=3, scheduler=sched)
    train(m, opt, sched, 1)
    save(file_url, m, opt, step=4, scheduler=sched)
    run = file_url[len("file://"):]
    script = tmp_path / "resume.py"
    script.write_text(
        "import json, os, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[2])))\n"
        "import ckptkit\n"
        "from ckptkit.torch import resume\n"
        "from models import make\n"
        "m, opt, sched = make(seed=2)\n"
        "try:\n"
        "    rep = resume(sys.argv[1], m, opt, scheduler=sched)\n"
        "    print(json.dumps({'step': None if rep is None else rep.step, 'skipped': [] if rep is None else rep.skipped}))\n"
        "except ckptkit.AccessError as e:\n"
        "    print(json.dumps({'access_error': str(e)}))\n"
    )

    def unprivileged():
        r = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all",
                            sys.executable, str(script), file_url, __file__], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    newest = os.path.join(run, "step-00000004")
    os.chmod(newest, 0)
    try:
        got = unprivileged()
        assert got.get("step") == 3, got
        assert any("step-00000004" in s["url"] and "unreadable" in s["reason"] for s in got["skipped"]), got
        os.chmod(os.path.join(run, "step-00000003"), 0)
        got = unprivileged()
        assert "access_error" in got and "unreadable" in got["access_error"], got
    finally:
        os.chmod(newest, 0o755)
        os.chmod(os.path.join(run, "step-00000003"), 0o755)


def test_metadata_read_once_per_resume(file_url, tmp_path):
    """Counted at the backend (CKPTKIT_IO_COUNT=1 in a fresh process): a
    resume from the run URL reads the chosen checkpoint's .metadata once, for
    both the choice and the load."""
    m, opt, sched = _trained()
    save(file_url, m, opt, step=2, scheduler=sched)
    save(file_url, m, opt, step=3, scheduler=sched)
    script = tmp_path / "count.py"
    script.write_text(
        "import json, os, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[2])))\n"
        "import ckptkit, ckptkit.torch as ct\n"
        "from models import make\n"
        "m, opt, sched = make(seed=5)\n"
        "rep = ct.resume(sys.argv[1], m, opt, scheduler=sched)\n"
        "print(json.dumps({'step': rep.step, 'md3': ckptkit.io_count('read', 'step-00000003/.metadata'),\n"
        "                  'md2': ckptkit.io_count('read', 'step-00000002/.metadata')}))\n"
    )
    env = dict(os.environ, CKPTKIT_IO_COUNT="1")
    r = subprocess.run([sys.executable, str(script), file_url, __file__], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"step": 3, "md3": 1, "md2": 0}, got


def _sha(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def test_resumes_a_checkpoint_torch_wrote_with_lazy_state():
    """Fixture torch2.6/lazy_moe2, written by torch 2.6's FileSystemWriter
    from get_state_dict: experts.1 has no AdamW state."""
    path = os.path.join(fixtures_dir(), "torch2.6", "lazy_moe2")
    if not os.path.isdir(path):
        pytest.skip(f"fixture {path} not available")
    with open(os.path.join(path, "expected.json")) as f:
        want = {k["key"]: k for k in json.load(f)["keys"]}
    m, opt, sched = make(seed=11)
    fresh_groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    rep = resume("file://" + os.path.abspath(path), m, opt, scheduler=sched)
    assert sorted(rep.lazy_params) == sorted(EXPERT1)
    assert rep.optimizer_loaded
    # Fields a newer torch added to the param groups and the scheduler are
    # not in this torch-2.6 checkpoint: they keep their current values.
    newer = [f"optimizer.param_groups.0.{k}" for k in fresh_groups[0] if k in ("decoupled_weight_decay",)]
    newer += ["scheduler._is_initial"] if "_is_initial" in sched.state_dict() else []
    assert set(newer) <= set(rep.kept_fields), rep.kept_fields
    assert all(k.startswith(("optimizer.param_groups.0.", "scheduler.")) for k in rep.kept_fields), rep.kept_fields
    for k in rep.kept_fields:
        field = k.rsplit(".", 1)[1]
        if k.startswith("optimizer."):
            assert opt.param_groups[0][field] == fresh_groups[0][field], k
    for n, t in m.state_dict().items():
        assert _sha(t) == want["model." + n]["sha256"], n
    names = dict(m.named_parameters())
    for n, p in names.items():
        if n in EXPERT1:
            assert p not in opt.state
            continue
        for slot in ("exp_avg", "exp_avg_sq", "step"):
            assert _sha(opt.state[p][slot]) == want[f"optimizer.state.{n}.{slot}"]["sha256"], (n, slot)


def test_torch_written_checkpoint_resumes(file_url):
    """A job switching to ckptkit keeps its old checkpoints: torch's own
    FileSystemWriter with get_state_dict's layout, resumed by resume()."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    m, opt, sched = _trained()
    msd, osd = get_state_dict(m, opt)
    path = file_url[len("file://"):] + "/step-00000003"
    dcp.save({"model": msd, "optimizer": osd, "scheduler": sched.state_dict(), "step": 3},
             storage_writer=dcp.FileSystemWriter(path))
    m2, opt2, sched2 = make(seed=8)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 3 and sorted(rep.lazy_params) == sorted(EXPERT1)
    _train_on_identically(m, opt, sched, m2, opt2, sched2)


@pytest.mark.parametrize("writer", ["ckptkit", "torch"])
def test_checkpoint_saved_before_the_first_optimizer_step_resumes_with_the_optimizer(file_url, writer):
    """Issue 30: a DCP checkpoint saved at step 0 (the optimizer's param
    groups, no state yet) failed "no optimizer keys"; it resumes with the
    optimizer, every parameter lazily absent, whether ckptkit.torch.save or
    torch's own FileSystemWriter wrote it."""
    m, opt, sched = make()
    names = [n for n, _ in m.named_parameters()]
    if writer == "ckptkit":
        save(file_url, m, opt, step=0, scheduler=sched)
    else:
        # get_state_dict would initialise the state; this is its layout
        # with the state still empty.
        groups = [dict(g, params=names) for g in opt.state_dict()["param_groups"]]
        dcp.save({"model": m.state_dict(), "optimizer": {"state": {}, "param_groups": groups},
                  "scheduler": sched.state_dict(), "step": 0},
                 storage_writer=dcp.FileSystemWriter(file_url[len("file://"):] + "/step-00000000"))
    m2, opt2, sched2 = make(seed=8)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 0 and rep.optimizer_loaded
    assert sorted(rep.lazy_params) == sorted(names)
    assert not opt2.state
    _train_on_identically(m, opt, sched, m2, opt2, sched2)


def test_flipped_byte_is_refused_by_resume_before_anything_changes(file_url):
    m, opt, sched = _trained()
    save(file_url, m, opt, step=3, scheduler=sched)
    from test_dcp import _flip_byte_in_tensor

    obj, _ = _flip_byte_in_tensor(file_url[len("file://"):] + "/step-00000003", "model.head.weight")
    m2, opt2, sched2 = _trained(steps=1)
    before = snapshot(m2, opt2)
    with pytest.raises(ckptkit.ChecksumError) as e:
        resume(step_url(file_url, 3), m2, opt2, scheduler=sched2)
    assert "model.head.weight" in str(e.value) and obj in str(e.value) and "offset" in str(e.value)
    assert same(before, snapshot(m2, opt2))


def _flip_byte_in_native(path, key):
    """Flip a byte inside key's first chunk of a ckptkit-format checkpoint."""
    with open(os.path.join(path, "ckptkit.metadata.json")) as f:
        md = json.load(f)
    (chunk,) = [t["chunks"][0] for t in md["tensors"] if t["key"] == key]
    at = chunk["offset"] + chunk["length"] - 3
    with open(os.path.join(path, chunk["object"]), "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))
    return chunk["object"], at


@pytest.mark.parametrize("how", ["dcp", "async"])
def test_damaged_newest_checkpoint_falls_back_to_the_next_older_valid_one(file_url, how):
    def ck_save(m, opt, sched, step):
        if how == "async":
            save(file_url, m, opt, step=step, scheduler=sched, async_save=True).wait()
        else:
            save(file_url, m, opt, step=step, scheduler=sched)

    m, opt, sched = _trained()
    ck_save(m, opt, sched, 3)
    want, want_epoch = snapshot(m, opt), sched.last_epoch
    train(m, opt, sched, 3)
    ck_save(m, opt, sched, 6)
    path = file_url[len("file://"):] + "/step-00000006"
    if how == "async":
        _flip_byte_in_native(path, "model.head.weight")
    else:
        from test_dcp import _flip_byte_in_tensor

        _flip_byte_in_tensor(path, "model.head.weight")
    m2, opt2, sched2 = make(seed=7)
    with pytest.warns(RuntimeWarning, match=r"step-00000006 is damaged \(.*checksum.*\); resuming from the next older "
                                            r"valid checkpoint, .*step-00000003") as caught:
        rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert sum("is damaged" in str(w.message) for w in caught) == 1, "the fallback is reported once"
    assert rep.step == 3 and rep.url.endswith("step-00000003") and rep.checkpoint_step == 3
    assert [s["url"].endswith("step-00000006") for s in rep.skipped] == [True]
    assert same_bits(want, snapshot(m2, opt2))
    assert sched2.last_epoch == want_epoch
    # And it trains on exactly like the step-3 state does.
    m3, opt3, sched3 = make(seed=8)
    resume(step_url(file_url, 3), m3, opt3, scheduler=sched3)
    _train_on_identically(m3, opt3, sched3, m2, opt2, sched2)


def test_damaged_checkpoint_url_does_not_fall_back(file_url):
    m, opt, sched = _trained()
    save(file_url, m, opt, step=3, scheduler=sched)
    save(file_url, m, opt, step=6, scheduler=sched)
    from test_dcp import _flip_byte_in_tensor

    _flip_byte_in_tensor(file_url[len("file://"):] + "/step-00000006", "model.head.weight")
    m2, opt2, sched2 = make(seed=7)
    with pytest.raises(ckptkit.ChecksumError):
        resume(step_url(file_url, 6), m2, opt2, scheduler=sched2)


def test_save_raises_ckptkit_errors(file_url):
    """ct.save raises ckptkit's own class (torch's CheckpointException
    chained), not a 20-line wrapper: a committed step is a ConflictError
    unless overwrite=True."""
    m, opt, sched = make()
    train(m, opt, sched, 1)
    save(file_url, m, opt, step=1, scheduler=sched)
    with pytest.raises(ckptkit.ConflictError) as e:
        save(file_url, m, opt, step=1, scheduler=sched)
    assert e.value.__cause__ is not None
    save(file_url, m, opt, step=1, scheduler=sched, overwrite=True)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="this torch has no torch.compile")
def test_compiled_model_resumes_into_the_plain_one(file_url):
    """A torch.compile'd model saves under the plain names (no _orig_mod.),
    as torch's get_state_dict does: its checkpoint resumes into the plain
    module bit-exactly, and a plain checkpoint into a compiled one."""
    m, opt, sched = make()
    cm = torch.compile(m, backend="eager")
    train(cm, opt, sched, 3)
    url = save(file_url, cm, opt, step=3, scheduler=sched)
    ck = ckptkit.torch.Checkpoint(url)
    keys = ck.keys()
    ck.close()
    assert not any("_orig_mod" in k for k in keys), keys
    m2, opt2, sched2 = make(seed=5)
    assert resume(url, m2, opt2, scheduler=sched2).step == 3
    assert same_bits(snapshot(m, opt), snapshot(m2, opt2))
    m3, opt3, sched3 = make(seed=6)
    assert resume(url, torch.compile(m3, backend="eager"), opt3, scheduler=sched3).step == 3
    assert same_bits(snapshot(m, opt), snapshot(m3, opt3))


class _NotAllowed:
    """A value torch.load(weights_only=True) refuses to rebuild."""

    def __init__(self, x):
        self.x = x


def test_a_value_that_does_not_decode_fails_before_anything_changes(file_url):
    """A value Python must decode (here extra state pickled as an object
    weights_only loading refuses) fails the resume with BadCheckpointError
    naming the key, before any tensor of the model or optimizer changes."""
    m, opt, sched = _trained()
    url = save(file_url, m, opt, step=3, scheduler=sched, extra_state={"obj": _NotAllowed(1)}, async_save=True).wait()
    m2, opt2, sched2 = make(seed=4)
    train(m2, opt2, sched2, 1)
    before = snapshot(m2, opt2)
    with pytest.raises(ckptkit.BadCheckpointError, match="'obj' does not decode"):
        resume(url, m2, opt2, scheduler=sched2, extra_state={"obj": None})
    assert same_bits(before, snapshot(m2, opt2))


def test_run_whose_committed_checkpoints_all_fail_is_refused_not_restarted(file_url):
    """A run whose only committed checkpoint does not open (its metadata is
    garbage) is refused with a BadCheckpointError naming it (the Go core's
    run.RefusedError), never a fresh start (None); nothing is modified."""
    m, opt, sched = _trained()
    run = sub_url(file_url, "run")
    save(run, m, opt, step=3, scheduler=sched)
    meta = os.path.join(file_url[len("file://"):], "run", "step-00000003", ".metadata")
    with open(meta, "wb") as f:
        f.write(b"not a pickle")
    m2, opt2, sched2 = make()
    before = snapshot(m2, opt2)
    with pytest.raises(ckptkit.BadCheckpointError, match="every committed checkpoint failed verification") as e:
        resume(run, m2, opt2, scheduler=sched2)
    assert "step-00000003" in str(e.value)
    assert same(before, snapshot(m2, opt2))


def test_resume_loads_into_tensors_on_another_device_through_a_cpu_buffer(file_url):
    # CPU-only here: the meta device takes the path of a GPU (a CPU buffer,
    # then copy_ onto the device; onto meta it stores nothing). A model with
    # one layer on meta and one on the CPU loads both: the CPU one gets the
    # saved values, the meta one stays meta, and every byte was read.
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    save(file_url, src, step=5)
    dst = torch.nn.Sequential(torch.nn.Linear(64, 64, device="meta"), torch.nn.Linear(64, 8))
    rep = resume(file_url, dst)
    assert rep.step == 5
    assert dst[0].weight.device.type == "meta" and dst[0].weight.shape == (64, 64)
    assert torch.equal(dst[1].weight, src[1].weight) and torch.equal(dst[1].bias, src[1].bias)
    nbytes = sum(p.numel() * p.element_size() for p in src.parameters())
    assert rep.bytes_read >= nbytes, (rep.bytes_read, nbytes)

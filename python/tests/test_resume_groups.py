"""resume refuses a checkpoint whose optimizer param groups differ from the
optimizer's before anything is modified (docs/RESUME.md, the param-group
rule): the Go loader compares the groups before the first target byte is
written, so the model, its buffers, the optimizer and the scheduler stay
exactly as they were."""

import pytest
import torch

import ckptkit
from ckptkit.torch import resume, save, step_url

from models import TinyMoE, same_bits, snapshot, train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")

HEAD = {"head.weight", "head.bias"}


def _groups(m, layout):
    """The optimizer's param groups of layout: "one" (every parameter in
    one group), "two" (the head in a group of its own) or "moved" (two
    groups, the router's weight moved over to the head's)."""
    named = list(m.named_parameters())
    if layout == "one":
        return [{"params": [p for _, p in named]}]
    second = set(HEAD) | ({"router.weight"} if layout == "moved" else set())
    return [{"params": [p for n, p in named if n not in second]},
            {"params": [p for n, p in named if n in second], "lr": 0.005}]


def _make(layout, seed):
    """A TinyMoE with a registered buffer, AdamW over the layout's groups
    and StepLR, seeded."""
    torch.manual_seed(seed)
    m = TinyMoE()
    m.register_buffer("scale", torch.randn(4))
    opt = torch.optim.AdamW(_groups(m, layout), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return m, opt, sched


def _save(url, how, m, opt, sched, step):
    if how == "async":  # ckptkit's native format, through the Go saver
        save(url, m, opt, step=step, scheduler=sched, async_save=True).wait()
    else:  # DCP: dcp.save through StorageWriter
        save(url, m, opt, step=step, scheduler=sched)


@pytest.mark.parametrize("how", ["dcp", "async"])
@pytest.mark.parametrize("saved,resumed,names", [
    ("one", "two", ["the checkpoint has 1 optimizer param group", "the target's optimizer has 2"]),  # more groups
    ("two", "one", ["the checkpoint has 2 optimizer param group", "the target's optimizer has 1"]),  # fewer groups
    ("two", "moved", ["router.weight", "param group 0", "param group 1"]),  # same count, a parameter moved
])
def test_other_param_groups_are_refused_before_anything_changes(file_url, how, saved, resumed, names):
    m, opt, sched = _make(saved, seed=0)
    train(m, opt, sched, 3, route=None)
    _save(file_url, how, m, opt, sched, 3)

    m2, opt2, sched2 = _make(resumed, seed=5)
    train(m2, opt2, sched2, 1, route=None)
    before = snapshot(m2, opt2)
    assert any(k == ("model", "scale") for k in before)  # the buffer is compared too
    hyper = [dict((k, v) for k, v in g.items() if k != "params") for g in opt2.param_groups]
    sd_before = opt2.state_dict()
    epoch = sched2.last_epoch
    # By the checkpoint URL (transactional load) and by the run URL (the
    # one-pass load that may fall back to an older checkpoint).
    for url in (step_url(file_url, 3), file_url):
        with pytest.raises(ckptkit.LayoutMismatchError) as e:
            resume(url, m2, opt2, scheduler=sched2)
        assert same_bits(before, snapshot(m2, opt2)), "the model or the optimizer state changed"
        assert [dict((k, v) for k, v in g.items() if k != "params") for g in opt2.param_groups] == hyper
        assert opt2.state_dict()["param_groups"] == sd_before["param_groups"]
        assert sched2.last_epoch == epoch
        assert e.value.cls == ckptkit.errors.BAD_CHECKPOINT
        msg = str(e.value)
        for n in names:
            assert n in msg, msg


@pytest.mark.parametrize("how", ["dcp", "async"])
def test_same_groups_in_another_order_within_a_group_resume(file_url, how):
    m, opt, sched = _make("two", seed=0)
    train(m, opt, sched, 3, route=None)
    _save(file_url, how, m, opt, sched, 3)

    torch.manual_seed(5)
    m2 = TinyMoE()
    m2.register_buffer("scale", torch.randn(4))
    named = list(m2.named_parameters())
    first = [p for n, p in named if n not in HEAD]
    opt2 = torch.optim.AdamW([{"params": list(reversed(first))},
                              {"params": [p for n, p in named if n in HEAD], "lr": 0.005}], lr=0.01)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 3 and rep.optimizer_loaded
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    names2 = {id(p): n for n, p in m2.named_parameters()}
    names = {id(p): n for n, p in m.named_parameters()}
    got = {names2[id(p)]: s for p, s in opt2.state.items()}
    for p, s in opt.state.items():
        for k, v in s.items():
            assert torch.equal(v, got[names[id(p)]][k]), (names[id(p)], k)
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]


@pytest.mark.parametrize("how", ["dcp", "async"])
def test_fallback_to_a_checkpoint_with_other_groups_is_refused_naming_the_damaged_one(file_url, how):
    # step 3 saved with one group; the run was restarted with two groups and
    # saved step 6, whose data is then damaged: the one-pass load of step 6
    # fails (midway, when it had written a target: the message then says
    # the targets were partly filled), the fallback's step 3 breaks the
    # param-group rule and is refused before it writes anything.
    m, opt, sched = _make("one", seed=0)
    train(m, opt, sched, 3, route=None)
    _save(file_url, how, m, opt, sched, 3)
    m, opt, sched = _make("two", seed=1)
    train(m, opt, sched, 3, route=None)
    _save(file_url, how, m, opt, sched, 6)
    path = file_url[len("file://"):] + "/step-00000006"
    if how == "async":
        from test_resume import _flip_byte_in_native

        _flip_byte_in_native(path, "model.head.weight")
    else:
        from test_dcp import _flip_byte_in_tensor

        _flip_byte_in_tensor(path, "model.head.weight")

    m2, opt2, sched2 = _make("two", seed=5)
    before = snapshot(m2, opt2)
    with pytest.raises(ckptkit.LayoutMismatchError) as e:
        resume(file_url, m2, opt2, scheduler=sched2)
    msg = str(e.value)
    assert "step-00000003" in msg and "the checkpoint has 1 optimizer param group" in msg, msg
    assert "after falling back from a damaged one" in msg and "step-00000006" in msg and "checksum" in msg, msg
    if "partly filled" not in msg:
        # The damaged attempt failed before writing: nothing changed at all.
        assert same_bits(before, snapshot(m2, opt2))

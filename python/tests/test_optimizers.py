"""Every optimizer through ckptkit.torch.save / resume: torch's own (those
this torch has: feature tests, never version strings), a list of two (Muon
for the matrices + AdamW for the rest, as torchtitan's OptimizersContainer),
and a third-party one with a float step and None buffers.

Each case trains a TinyMoE whose expert 1 gets no token before the save (its
parameters have no optimizer state: lazily absent), saves, and trains on =
the reference; a fresh model and optimizer resume and train on the same
steps: parameters, optimizer state and hyper-parameters end bit-identical.
And each has a partial-state variant (one slot of one parameter deleted
from the saved state) refused with PartialStateError naming the key, before
anything changes."""

import copy
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageWriter, resume, save, step_url
from ckptkit.torch import _census, _optimizer_state
from ckptkit.torch._storage import census_members, decode_integrity

from models import TinyMoE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

EXPERT1 = [f"experts.1.{w}.{p}" for w in ("w_in", "w_out") for p in ("weight", "bias")]


class FloatStepMomentum(torch.optim.Optimizer):
    """A third-party optimizer following torch.optim.Optimizer's protocol,
    with a float step and, in a group with beta 0, a None buffer (non-tensor
    state values), and a constructor that takes its hyper-parameters only
    positionally-or-by-name (no **kwargs)."""

    def __init__(self, params, lr, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0.0
                    st["buf"] = torch.zeros_like(p) if g["beta"] else None
                st["step"] += 1.0
                d = p.grad
                if st["buf"] is not None:
                    st["buf"].mul_(g["beta"]).add_(p.grad)
                    d = st["buf"]
                p.add_(d, alpha=-g["lr"] / st["step"] ** 0.5)


class ConfiguredMomentum(FloatStepMomentum):
    """Its constructor takes a config object, neither the param groups'
    hyper-parameters nor none: the scratch optimizer resume learns the fresh
    state from is built the way unpickling builds one."""

    def __init__(self, params, config):
        torch.optim.Optimizer.__init__(self, params, {"lr": config["lr"], "beta": config["beta"]})


def _matrices(m):
    return [p for p in m.parameters() if p.ndim == 2]


def _others(m):
    return [p for p in m.parameters() if p.ndim != 2]


def _experts(m, i=None):
    return [p for n, p in m.named_parameters() if n.startswith("experts.") and (i is None or n.startswith(f"experts.{i}."))]


def _non_experts(m):
    return [p for n, p in m.named_parameters() if not n.startswith("experts.")]


# name -> (factory: model -> optimizer or list, slot to delete for the
# partial variant, feature the torch must have)
CASES = {
    "sgd_momentum": (lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), "momentum_buffer", None),
    "sgd_nesterov": (lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
                     "momentum_buffer", None),
    "rmsprop": (lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01, momentum=0.9, centered=True), "grad_avg", None),
    "adagrad": (lambda m: torch.optim.Adagrad(m.parameters(), lr=0.05), "sum", None),
    "adam_amsgrad": (lambda m: torch.optim.Adam(m.parameters(), lr=0.01, amsgrad=True), "max_exp_avg_sq", None),
    "adamw": (lambda m: torch.optim.AdamW(m.parameters(), lr=0.01), "exp_avg", None),
    "adamw_amsgrad_one_group": (
        lambda m: torch.optim.AdamW([{"params": _experts(m), "amsgrad": True}, {"params": _non_experts(m)}], lr=0.01),
        "max_exp_avg_sq", None),
    "nadam": (lambda m: torch.optim.NAdam(m.parameters(), lr=0.01), "mu_product", None),
    "radam": (lambda m: torch.optim.RAdam(m.parameters(), lr=0.01), "exp_avg_sq", None),
    "adamax": (lambda m: torch.optim.Adamax(m.parameters(), lr=0.01), "exp_inf", None),
    "adafactor": (lambda m: torch.optim.Adafactor(m.parameters(), lr=0.01), "col_var", "Adafactor"),
    "muon_adamw": (lambda m: [torch.optim.Muon(_matrices(m), lr=0.02),
                              torch.optim.AdamW(_others(m), lr=0.01)], "exp_avg_sq", "Muon"),
    # The same shape of list on every torch (Muon is only in newer ones).
    "sgd_adamw": (lambda m: [torch.optim.SGD(_matrices(m), lr=0.05, momentum=0.9),
                             torch.optim.AdamW(_others(m), lr=0.01)], "exp_avg", None),
    "third_party_float_step": (
        lambda m: FloatStepMomentum([{"params": _experts(m) + _matrices(m)[:1]},
                                     {"params": [p for p in _non_experts(m)[1:]], "beta": 0.0}], lr=0.02),
        "step", None),
    "third_party_config_ctor": (lambda m: ConfiguredMomentum(m.parameters(), {"lr": 0.02, "beta": 0.8}), "buf", None),
}


def _case(name):
    make_opt, slot, feature = CASES[name]
    if feature and not hasattr(torch.optim, feature):
        pytest.skip(f"this torch has no torch.optim.{feature}")
    return make_opt, slot


def _opts(opt):
    return list(opt) if isinstance(opt, (list, tuple)) else [opt]


def _make(make_opt, seed=0):
    torch.manual_seed(seed)
    m = TinyMoE()
    opt = make_opt(m)
    sched = torch.optim.lr_scheduler.StepLR(_opts(opt)[0], step_size=2, gamma=0.5)
    return m, opt, sched


def _train(m, opt, sched, routes, seed):
    g = torch.Generator().manual_seed(seed)
    for route in routes:
        x = torch.randn(16, 8, generator=g)
        y = torch.randn(16, 4, generator=g)
        loss = ((m(x, route=route) - y) ** 2).mean()
        for o in _opts(opt):
            o.zero_grad()
        loss.backward()
        for o in _opts(opt):
            o.step()
        sched.step()


BEFORE = [0, 0, 0]          # expert 1 gets no token: no state at the save
AFTER = [1, None, 0, 1]     # then it does


def _state(m, opt, sched):
    """Everything resume may change, by name: parameters, each parameter's
    optimizer state (tensors cloned), each group's hyper-parameters, the
    scheduler's state."""
    names = {id(p): n for n, p in m.named_parameters()}
    out = {("model", k): v.detach().clone() for k, v in m.state_dict().items()}
    for i, o in enumerate(_opts(opt)):
        for p, st in o.state.items():
            for k, v in st.items():
                out[("state", names[id(p)], k)] = v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v)
        for j, g in enumerate(o.param_groups):
            out[("group", i, j)] = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            out[("params", i, j)] = [names[id(p)] for p in g["params"]]
    out[("scheduler",)] = copy.deepcopy(sched.state_dict())
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b), key=str)
    for k in a:
        x, y = a[k], b[k]
        if torch.is_tensor(x):
            assert torch.is_tensor(y) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k
        else:
            assert type(x) is type(y) and x == y, (k, x, y)


def _lazy(m, opt):
    """The FQNs with no optimizer state now."""
    have = {id(p) for o in _opts(opt) for p, st in o.state.items() if st}
    return sorted(n for n, p in m.named_parameters() if id(p) not in have)


@pytest.mark.parametrize("how", ["dcp", "async"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_resumes_bit_identically(file_url, name, how):
    make_opt, _ = _case(name)
    m, opt, sched = _make(make_opt)
    _train(m, opt, sched, BEFORE, seed=1)
    lazy = _lazy(m, opt)
    if lazy != sorted(EXPERT1):
        # Adagrad before torch 2.10 makes every parameter's state in its
        # constructor: nothing is lazily absent.
        assert name == "adagrad" and lazy == [], lazy
    if how == "async":
        save(file_url, m, opt, step=3, scheduler=sched, async_save=True).wait()
    else:
        save(file_url, m, opt, step=3, scheduler=sched)
    saved = _state(m, opt, sched)
    _train(m, opt, sched, AFTER, seed=5)
    want = _state(m, opt, sched)

    m2, opt2, sched2 = _make(make_opt, seed=7)
    rep = resume(file_url, m2, opt2, scheduler=sched2)
    assert rep.step == 3 and rep.optimizer_loaded
    assert sorted(rep.lazy_params) == lazy
    assert rep.kept_fields == ()
    _assert_same(saved, _state(m2, opt2, sched2))  # resumed exactly what was saved
    _train(m2, opt2, sched2, AFTER, seed=5)
    _assert_same(want, _state(m2, opt2, sched2))


def _drop_item(path, key):
    """Remove key from a committed DCP checkpoint's .metadata (its data stays
    in the data file, referenced by nothing): what an incomplete save or a
    damaged copy leaves."""
    import pickle

    with open(os.path.join(path, ".metadata"), "rb") as f:
        md = pickle.load(f)
    del md.state_dict_metadata[key]
    for idx in [i for i in md.storage_data if i.fqn == key]:
        del md.storage_data[idx]
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


@pytest.mark.parametrize("how", ["state", "item"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_partial_state_is_refused_before_anything_changes(file_url, name, how):
    """One slot of one parameter deleted: from the state before the save
    ("state": the census records what was saved), or its item from the
    checkpoint's metadata after ckptkit.torch.save ("item": the census
    still says the parameter saved it)."""
    make_opt, slot = _case(name)
    m, opt, sched = _make(make_opt)
    _train(m, opt, sched, BEFORE, seed=1)
    osd = _optimizer_state(m, opt)
    fqn = sorted(f for f, st in osd["state"].items() if slot in st)[0]
    key = f"optimizer.state.{fqn}.{slot}"
    if how == "state":
        del osd["state"][fqn][slot]
        sd = {"model": m.state_dict(), "optimizer": osd, "scheduler": sched.state_dict(), "step": 3}
        dcp.save(sd, storage_writer=StorageWriter(step_url(file_url, 3), optimizer="saved", census=_census(osd)))
    else:
        save(file_url, m, opt, step=3, scheduler=sched)
        _drop_item(file_url[len("file://"):] + "/step-00000003", key)

    # The one resuming has state of its own (trained a step), none of which
    # may change.
    m2, opt2, sched2 = _make(make_opt, seed=7)
    _train(m2, opt2, sched2, [None], seed=2)
    before = _state(m2, opt2, sched2)
    if how == "state" and not osd["state"][fqn]:
        # The optimizer keeps one slot per parameter (SGD's momentum_buffer):
        # saved without it, the parameter has no saved state at all, which
        # is the lazily absent case, not partial state.
        rep = resume(step_url(file_url, 3), m2, opt2, scheduler=sched2)
        assert fqn in rep.lazy_params
        return
    with pytest.raises(ckptkit.PartialStateError) as e:
        resume(step_url(file_url, 3), m2, opt2, scheduler=sched2)
    msg = str(e.value)
    assert fqn in msg and key in msg, msg
    _assert_same(before, _state(m2, opt2, sched2))


def test_list_of_optimizers_is_saved_as_one_merged_state(file_url):
    """The layout of torch's get_optimizer_state_dict(model, [o1, o2]):
    state by FQN, param groups concatenated in list order."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    m, opt, sched = _make(CASES["sgd_adamw"][0])
    _train(m, opt, sched, BEFORE, seed=1)
    ours = _optimizer_state(m, opt)
    theirs = get_optimizer_state_dict(m, opt)
    assert sorted(ours["state"]) == sorted(theirs["state"])
    for f, st in ours["state"].items():
        assert st.keys() == theirs["state"][f].keys()
        for k, v in st.items():
            assert torch.equal(v, theirs["state"][f][k]) if torch.is_tensor(v) else v == theirs["state"][f][k]
    assert [sorted(g["params"]) for g in ours["param_groups"]] == [sorted(g["params"]) for g in theirs["param_groups"]]
    assert [{k: v for k, v in g.items() if k != "params"} for g in ours["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in theirs["param_groups"]]


def test_fresh_state_leaves_the_optimizer_and_the_rng_alone(file_url):
    """Building the resume target (one zero-gradient step of a scratch
    optimizer) changes nothing of the real one, nor the RNG, even when the
    load is then refused."""
    make_opt = CASES["adafactor"][0] if hasattr(torch.optim, "Adafactor") else CASES["adamw"][0]
    m, opt, sched = _make(make_opt)
    _train(m, opt, sched, BEFORE, seed=1)
    save(file_url, m, opt, step=3, scheduler=sched)
    m2, opt2, sched2 = _make(make_opt, seed=7)
    _train(m2, opt2, sched2, [None], seed=2)
    before = _state(m2, opt2, sched2)
    rng = torch.get_rng_state()
    # A frozen key the checkpoint lacks makes the Go loader refuse it
    # after the target was built.
    with pytest.raises(ckptkit.CheckpointError):
        resume(step_url(file_url, 3), m2, opt2, scheduler=sched2, extra_state={"absent": torch.zeros(2)})
    assert torch.equal(rng, torch.get_rng_state())
    _assert_same(before, _state(m2, opt2, sched2))


def _integrity_body(path):
    (name,) = [n for n in os.listdir(path) if n.startswith(".ckptkit-integrity")]
    with open(os.path.join(path, name), "rb") as f:
        return decode_integrity(f.read())[1]


def test_save_records_the_census_of_the_optimizer_state(file_url):
    """ct.save's integrity object records each parameter's slot set (an
    index into the distinct sets), -1 for the lazily absent ones."""
    m, opt, sched = _make(CASES["adamw_amsgrad_one_group"][0])
    _train(m, opt, sched, BEFORE, seed=1)
    save(file_url, m, opt, step=3, scheduler=sched)
    body = _integrity_body(file_url[len("file://"):] + "/step-00000003")
    names = sorted(n for n, _ in m.named_parameters())
    assert body["params"] == names
    got = {f: None if i < 0 else body["slot_sets"][i] for f, i in zip(body["params"], body["param_slots"])}
    for f in names:
        if f.startswith("experts.1."):
            assert got[f] is None, f
        elif f.startswith("experts.0."):
            assert got[f] == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"], f
        else:
            assert got[f] == ["exp_avg", "exp_avg_sq", "step"], f
    assert len(body["slot_sets"]) == 2
    # Without an optimizer, and with a standalone writer, there is none.
    save(file_url, m, step=4)
    assert "params" not in _integrity_body(file_url[len("file://"):] + "/step-00000004")
    dcp.save({"model": m.state_dict()}, storage_writer=StorageWriter(step_url(file_url, 5)))
    body = _integrity_body(file_url[len("file://"):] + "/step-00000005")
    assert not {"params", "slot_sets", "param_slots"} & body.keys()


def test_census_forms():
    by_fqn = {"b": ["step", "exp_avg"], "a": ("exp_avg", "step", "step"), "c": None, "d": [], "é": ["z", "B"]}
    # A state that holds nothing ("d") saves no key: like no state (-1).
    want = {"params": ["a", "b", "c", "d", "é"], "slot_sets": [["exp_avg", "step"], ["B", "z"]],
            "param_slots": [0, 0, -1, -1, 1]}
    assert census_members(by_fqn) == want
    assert census_members(want) == want
    for bad in ({"params": ["a"], "slot_sets": [], "param_slots": [0]}, {"a": "step"}, {"a": [1]}, {"a": [""]}, ["a"],
                {"params": ["a", "a"], "slot_sets": [["x"]], "param_slots": [0, 0]}):
        with pytest.raises(ckptkit.UsageError):
            census_members(bad)
    with pytest.raises(ckptkit.UsageError):
        StorageWriter("mem://x/y", census={"a": "step"})

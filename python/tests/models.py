"""Small models shared by the Python tests."""

import torch
from torch import nn


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_in = nn.Linear(8, 16)
        self.w_out = nn.Linear(16, 8)

    def forward(self, x):
        return self.w_out(torch.relu(self.w_in(x)))


class TinyMoE(nn.Module):
    """The layout of fixture torch2.6/lazy_moe2: embed, router, two experts,
    head. ``route`` None routes by the router (top-1); an int sends every
    token to that expert, so the other one never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.router = nn.Linear(8, 2)
        self.experts = nn.ModuleList([Expert(), Expert()])
        self.head = nn.Linear(8, 4)

    def forward(self, x, route=0):
        h = self.embed(x)
        gate = torch.softmax(self.router(h), dim=-1)
        if route is None:
            choice = gate.argmax(dim=-1)
        else:
            choice = torch.full((h.shape[0],), route, dtype=torch.long)
        out = torch.zeros_like(h)
        for i, e in enumerate(self.experts):
            sel = choice == i
            if sel.any():  # an expert with no tokens is not run
                out[sel] = e(h[sel]) * gate[sel, i : i + 1]
        return self.head(out)


def make(seed=0):
    """A TinyMoE with AdamW and StepLR, seeded."""
    torch.manual_seed(seed)
    m = TinyMoE()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return m, opt, sched


def train(m, opt, sched, steps, route=0, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = torch.randn(16, 4, generator=g)
        loss = ((m(x, route=route) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def snapshot(m, opt):
    """Deep copies of every model and optimizer tensor."""
    out = {("model", k): v.detach().clone() for k, v in m.state_dict().items()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[("opt", id(p), k)] = v.detach().clone()
    return out


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def same_bits(a, b):
    """Snapshots a and b (of different models: optimizer entries are keyed
    by parameter id) hold bit-identical tensors, in the same order."""
    def bits(t):
        return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""

    ka = [k for k in a if k[0] == "model"]
    if ka != [k for k in b if k[0] == "model"]:
        return False
    oa = [(k[2], v) for k, v in a.items() if k[0] == "opt"]
    ob = [(k[2], v) for k, v in b.items() if k[0] == "opt"]
    return (all(bits(a[k]) == bits(b[k]) for k in ka) and len(oa) == len(ob)
            and all(x[0] == y[0] and bits(x[1]) == bits(y[1]) for x, y in zip(oa, ob)))

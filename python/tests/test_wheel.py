"""The platform wheel (`make wheel`: dist/ckptkit-<version>-py3-none-<platform>.whl) installs
with `pip install --no-index` into a fresh virtual environment of this torch environment and
saves and resumes from there: no PYTHONPATH, no Go on the PATH, nothing of the source tree."""

import glob
import os
import subprocess
import sys
import zipfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

PROBE = r"""
import os, sys, torch
import ckptkit, ckptkit.torch as ct
assert os.path.realpath(ckptkit.__file__).startswith(os.path.realpath(sys.prefix)), ckptkit.__file__
torch.manual_seed(0)
def make():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return m, torch.optim.AdamW(m.parameters(), lr=0.01)
m, o = make()
for _ in range(2):
    m(torch.randn(3, 4)).sum().backward()
    o.step()
    o.zero_grad()
url = "file://" + sys.argv[1]
ct.save(url, m, o, step=2)
m2, o2 = make()
rep = ct.resume(url, m2, o2)
assert rep.step == 2, rep
for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
    assert torch.equal(a, b), k
s1, s2 = o.state_dict()["state"], o2.state_dict()["state"]
assert s1.keys() == s2.keys() and all(torch.equal(s1[i][k], s2[i][k]) for i in s1 for k in s1[i])
print("resumed", rep.step, "from", os.path.dirname(ckptkit.__file__))
"""


def wheel():
    found = glob.glob(os.path.join(REPO, "dist", "ckptkit-*-py3-none-*.whl"))
    assert len(found) == 1, f"one wheel in dist/, built by `make wheel` (scripts/wheel.sh): {found}"
    return found[0]


def test_the_wheel_is_platform_tagged_and_carries_the_library():
    whl = wheel()
    assert not whl.endswith("-none-any.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert any(n.endswith("ckptkit/libckptkit.so") for n in names), names
    assert any(n.endswith("ckptkit/torch/pickle_allowlist.json") for n in names), names
    # The type hints are for its users too (PEP 561).
    assert any(n.endswith("ckptkit/py.typed") for n in names), names
    assert not any("/tests/" in n for n in names), names


def test_the_installed_wheel_saves_and_resumes(tmp_path):
    venv = tmp_path / "venv"
    # The venv sees the environment's torch (system site packages) and pip;
    # ckptkit comes only from the wheel.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "USE_LIBUV": "0"}
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheel()],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([py, "-c", "import shutil; print(shutil.which('go'))"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.stdout.strip() == "None", "Go is on the PATH of the probe"
    ckpt = tmp_path / "run"
    r = subprocess.run([py, "-c", PROBE, str(ckpt)], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("resumed 2 from " + str(venv)), r.stdout

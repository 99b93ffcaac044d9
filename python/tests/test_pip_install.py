"""`pip install ./python` (after `make python`) gives a working
`import ckptkit.torch`: the shared library travels as package data.

Offline, so no build isolation: setuptools comes from the environment."""

import os
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_pip_install_gives_a_working_import(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no pip in this environment")
    # Build from a copy: pip builds in tree and would leave build/ and
    # *.egg-info in the repository.
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--break-system-packages", "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "ckptkit" / "libckptkit.so").is_file()
    assert (target / "ckptkit" / "py.typed").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    probe = ("import ckptkit, ckptkit.torch, os; "
             "print(os.path.dirname(ckptkit.__file__)); "
             "s = ckptkit.Store('mem://pip-install/x'); s.put('k', b'abc'); print(s.read('k').decode())")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    where, got = r.stdout.split()
    assert where == str(target / "ckptkit"), "imported the installed copy, not the tree's"
    assert got == "abc"

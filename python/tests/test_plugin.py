"""A plugin scheme (the example fsplugin, a real plugin process over
hashicorp/go-plugin) through libckptkit: CKPTKIT_PLUGIN_DIR is read on the
first open, as the CLI does."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_DIR = os.path.join(HERE, "..", "..", "bin", "plugins")

SCRIPT = """
import sys, warnings, torch
warnings.simplefilter("ignore")
import torch.distributed.checkpoint as dcp
import ckptkit
from ckptkit.torch import StorageReader, StorageWriter
url = sys.argv[1]
st = ckptkit.Store(url)
st.put("hello", b"plugin world", if_absent=st.capabilities().create_if_absent)
assert st.read("hello", 7, 5) == b"world"
sd = {"w": torch.arange(1000, dtype=torch.float32), "step": 7}
dcp.save(sd, storage_writer=StorageWriter(url + "/ck"))
out = {"w": torch.zeros(1000), "step": 0}
dcp.load(out, storage_reader=StorageReader(url + "/ck"))
assert torch.equal(out["w"], sd["w"]) and out["step"] == 7
print("ok", sorted(o.key for o in st.list("ck/")))
"""


def test_plugin_scheme_round_trip(tmp_path):
    plugin = os.path.join(PLUGIN_DIR, "fsplugin")
    if not os.path.exists(plugin):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{plugin} missing (go build -o bin/plugins/fsplugin ./plugins/examples/fsplugin)")
        pytest.skip(f"{plugin} missing (go build -o bin/plugins/fsplugin ./plugins/examples/fsplugin)")
    env = dict(os.environ, CKPTKIT_PLUGIN_DIR=os.path.abspath(PLUGIN_DIR))
    r = subprocess.run([sys.executable, "-c", SCRIPT, "localdir://" + str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok") and ".metadata" in r.stdout and ".ckptkit-integrity" in r.stdout
    assert os.path.exists(tmp_path / "ck" / ".metadata")  # written by the plugin process

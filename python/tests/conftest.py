"""Shared fixtures of the ckptkit Python suite (runs inside the torch 2.6
environment: scripts/torch-env.sh run python3 -m pytest python/tests)."""

import os
import signal
import uuid

import pytest

os.environ.setdefault("USE_LIBUV", "0")

# The Ctrl-C tests need SIGINT to raise KeyboardInterrupt, here and in the
# Python children they start. A process started in the background by a
# shell without job control (`cmd &` in a script, nohup) inherits SIGINT
# *ignored*; Python then installs no handler and the signal does nothing,
# in this process and, through exec, in every child. Installing Python's
# own handler here undoes that: a handled signal is reset to the default
# in a child at exec, so children install theirs again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def sub_url(url, *parts):
    """url with path elements appended before its query."""
    base, sep, query = url.partition("?")
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts]) + sep + query


def _backends():
    out = ["file", "mem"]
    if os.environ.get("CKPTKIT_TEST_S3_URL"):
        out.append("s3")
    if os.environ.get("CKPTKIT_TEST_GCS_URL"):
        out.append("gcs")
    return out


BACKENDS = _backends()


@pytest.fixture(params=["file", "mem", "s3", "gcs"])
def base_url(request, tmp_path):
    """A fresh prefix on every backend: file://, mem:// (one process), and the
    S3 and GCS test servers when scripts/test.sh started them."""
    name = request.param
    unique = f"pytest-{uuid.uuid4().hex[:12]}"
    if name == "file":
        return "file://" + str(tmp_path)
    if name == "mem":
        return f"mem://{unique}"
    env = {"s3": "CKPTKIT_TEST_S3_URL", "gcs": "CKPTKIT_TEST_GCS_URL"}[name]
    url = os.environ.get(env)
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{env} is not set (CI=true: the {name} test server must be running)")
        pytest.skip(f"{env} not set (start the servers: scripts/test-servers.sh)")
    return sub_url(url, unique)


@pytest.fixture
def file_url(tmp_path):
    """A fresh file:// prefix."""
    return "file://" + str(tmp_path)


def fixtures_dir():
    """The DCP fixtures written by torch itself, part of the repository
    (interop/torchdcp/testdata: torch 1.13 cases at the top, torch2.6/ and
    torch2.14/ below). Missing is a failure, never a skip."""
    here = os.path.dirname(os.path.abspath(__file__))
    d = os.path.join(here, "..", "..", "interop", "torchdcp", "testdata")
    assert os.path.isdir(os.path.join(d, "torch2.6")), f"the DCP fixtures are part of the repository: {d}"
    return d

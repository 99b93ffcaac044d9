"""The C ABI a training job can trust (issue 28): handles that cannot crash
the process, panics surfacing as errors, cancellation by Ctrl-C, fork
safety, the JSON contract, the environment of the moment; and a failed last
asynchronous save that is never silent (issue 30).

Everything that could abort or hang the interpreter runs in a subprocess
whose exit code is asserted."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import ckptkit
from ckptkit import _lib, _wire
from conftest import sub_url

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run_py(code, *, env=None, timeout=120, check=True):
    """Run code in a fresh interpreter; return the CompletedProcess."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), HERE])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                       timeout=timeout)
    if check:
        assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    return r


def s3_url():
    url = os.environ.get("CKPTKIT_TEST_S3_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("CKPTKIT_TEST_S3_URL is not set")
        pytest.skip("CKPTKIT_TEST_S3_URL not set (start the servers: scripts/test-servers.sh)")
    return sub_url(url, f"pytest-{uuid.uuid4().hex[:12]}")


# Every export that takes a handle, called through the binding with handle
# h (the other arguments valid).
EXPORTS = r'''
import ctypes, ckptkit
from ckptkit import _lib

def p():
    return ctypes.c_void_p()

CALLS = {
    "ckpt_close": lambda h: _lib.call("ckpt_close", h),
    "ckpt_url": lambda h: _lib.call("ckpt_url", h, b"k", ctypes.byref(p())),
    "ckpt_capabilities": lambda h: _lib.call("ckpt_capabilities", h, ctypes.byref(p())),
    "ckpt_put": lambda h: _lib.call("ckpt_put", h, b"k", (ctypes.c_void_p * 1)(), (ctypes.c_int64 * 1)(), None, 0, 0,
                                    (ctypes.c_uint32 * 1)(), ctypes.byref(ctypes.c_uint32())),
    "ckpt_read": lambda h: _lib.call("ckpt_read", h, b"k", 0, 0, None, ctypes.byref(ctypes.c_uint32())),
    "ckpt_read_segments": lambda h: _lib.call("ckpt_read_segments", h, b"k", 0, 0, None, None, None),
    "ckpt_read_all": lambda h: _lib.call("ckpt_read_all", h, b"k", 0, 0, ctypes.byref(p()),
                                         ctypes.byref(ctypes.c_int64())),
    "ckpt_stat": lambda h: _lib.call("ckpt_stat", h, b"k", *(ctypes.byref(ctypes.c_int64()) for _ in range(2)),
                                     ctypes.byref(ctypes.c_uint32()), ctypes.byref(ctypes.c_int())),
    "ckpt_list": lambda h: _lib.call("ckpt_list", h, b"", ctypes.byref(p())),
    "ckpt_delete": lambda h: _lib.call("ckpt_delete", h, b"k"),
    "ckpt_checkpoint_metadata": lambda h: _lib.call("ckpt_checkpoint_metadata", h, ctypes.byref(p()),
                                                    ctypes.byref(ctypes.c_int64())),
    "ckpt_checkpoint_close": lambda h: _lib.call("ckpt_checkpoint_close", h),
    "ckpt_checkpoint_load": lambda h: _lib.call("ckpt_checkpoint_load", h, b"{}", None, 0, ctypes.byref(p())),
    "ckpt_saver_save": lambda h: _lib.call("ckpt_saver_save", h, b"mem://x", None, b"{}", None, 0,
                                           ctypes.byref(ctypes.c_size_t())),
    "ckpt_save_state": lambda h: _lib.call("ckpt_save_state", h, ctypes.byref(ctypes.c_int())),
    "ckpt_save_wait": lambda h: _lib.call("ckpt_save_wait", h, 0, ctypes.byref(ctypes.c_int()), ctypes.byref(p())),
    "ckpt_save_wait_staged": lambda h: _lib.call("ckpt_save_wait_staged", h, 0, ctypes.byref(ctypes.c_int())),
    "ckpt_save_release": lambda h: _lib.call("ckpt_save_release", h),
    "ckpt_saver_cancel": lambda h: _lib.call("ckpt_saver_cancel", h),
    "ckpt_saver_stats": lambda h: _lib.call("ckpt_saver_stats", h, ctypes.byref(p())),
    "ckpt_saver_idle": lambda h: _lib.call("ckpt_saver_idle", h, 0),
    "ckpt_saver_idle(close)": lambda h: _lib.call("ckpt_saver_idle", h, 1),
    "ckpt_checkpoint_fail": lambda h: _lib.call("ckpt_checkpoint_fail", h, 1, None, b"m"),
    "ckpt_tiered_committed": lambda h: _lib.call("ckpt_tiered_committed", h, 1, ctypes.byref(p())),
    "ckpt_tiered_wait": lambda h: _lib.call("ckpt_tiered_wait", h, 0, ctypes.byref(p())),
    "ckpt_tiered_close": lambda h: _lib.call("ckpt_tiered_close", h, 0),
    "ckpt_read_items": lambda h: _lib.call("ckpt_read_items", h, 0, None, None, None, None, None, None, 1,
                                           ctypes.byref(ctypes.c_int())),
}
'''
CALL_NAMES = re.findall(r'^    "(ckpt_[a-z_()]+)":', EXPORTS, re.M)


def test_every_export_taking_a_handle_is_in_the_bad_handle_test():
    # The header cgo generates (make python) lists every export.
    with open(os.path.join(REPO, "python", "ckptkit", "libckptkit.h")) as f:
        header = f.read()
    taking = set(re.findall(r"^extern \S+ (ckpt_\w+)\([^)]*uintptr_t h\b", header, re.M))
    assert len(taking) >= 20, taking
    assert taking <= set(CALL_NAMES), f"exports not called with bad handles: {sorted(taking - set(CALL_NAMES))}"


@pytest.mark.parametrize("name", CALL_NAMES)
def test_every_export_refuses_bad_handles_with_a_usage_error(name, tmp_path):
    # One interpreter per export: none aborts (the exit code), the export
    # raises UsageError for a zero, random, closed and stale handle.
    r = run_py(EXPORTS + f'''
import random
url = "file://{tmp_path}"
CALLS = {{{name!r}: CALLS[{name!r}]}}
def bad():
    if kind == "zero":
        return 0
    if kind == "random":
        return random.getrandbits(64) or 1
    st = ckptkit.Store(url)
    h = st._h
    st.close()
    if kind == "stale":
        # the slot reused by a live store: the old handle stays dead
        keep.append(ckptkit.Store(url))
    return h
keep = []
wrong = []
for kind in ("zero", "random", "closed", "stale"):
    for name, fn in CALLS.items():
        for _ in range(3):
            try:
                fn(bad())
            except ckptkit.UsageError:
                continue
            except Exception as e:
                wrong.append(f"{{name}}, {{kind}} handle: {{type(e).__name__}}: {{e}}")
            else:
                wrong.append(f"{{name}}, {{kind}} handle: no error")
            break
# A bad cancellation token is refused too.
st = ckptkit.Store(url)
try:
    _lib._invoke(_lib.lib().ckpt_list, (12345, st._h, b"", ctypes.byref(p())))
    wrong.append("bad token: no error")
except ckptkit.UsageError:
    pass
print("\\n".join(wrong))
assert not wrong
''')
    assert r.stdout.strip() == ""


def test_read_vs_close_in_two_threads_never_aborts(tmp_path):
    # 200 rounds of a reader thread against close(), for a Store and for a
    # Checkpoint; the process exits 0 (an abort would be 134).
    r = run_py(f'''
import threading, ckptkit
from ckptkit.torch import Checkpoint, save
import torch
url = "file://{tmp_path}"
st0 = ckptkit.Store(url)
st0.put("obj", b"x" * 65536)
m = torch.nn.Linear(8, 8)
ck_url = save(url + "/run", m, step=1)
usage = 0
before = ckptkit.live_handles()
for i in range(200):
    obj = ckptkit.Store(url) if i % 2 == 0 else Checkpoint(ck_url)
    go = threading.Event()
    def reader():
        global usage
        go.set()
        while True:
            try:
                if isinstance(obj, ckptkit.Store):
                    obj.read("obj", 0, 65536)
                else:
                    obj.raw_metadata()
                    obj.object_url("x")
            except ckptkit.UsageError:
                usage += 1
                return
    t = threading.Thread(target=reader)
    t.start()
    go.wait()
    obj.close()
    t.join()
print("usage", usage)
assert ckptkit.live_handles() == before, (before, ckptkit.live_handles())  # none leaked
''', timeout=300)
    assert "usage 200" in r.stdout


def test_a_go_panic_is_an_internal_error_not_an_abort(tmp_path):
    r = run_py(f'''
import os, ckptkit
url = "file://{tmp_path}"
os.environ["CKPTKIT_TEST_PANIC"] = "1"  # after import: passed at the open
try:
    ckptkit.Store(url)
except ckptkit.CheckpointError as e:
    assert type(e) is ckptkit.CheckpointError and e.class_name == "internal", (type(e), e.cls)
    assert "panic" in str(e) and "ckpt_open" in str(e), e
else:
    raise AssertionError("no error")
del os.environ["CKPTKIT_TEST_PANIC"]
st = ckptkit.Store(url)  # the process goes on
st.put("a", b"1")
assert st.read("a") == b"1"
print("ok")
''')
    assert "ok" in r.stdout
    # The panic and its stack are in the log.
    assert "panic in the Go core" in r.stderr and "goroutine" in r.stderr


def _golden():
    with open(os.path.join(REPO, "capi", "testdata", "abi_golden.json")) as f:
        return json.load(f)


def test_golden_json_field_names_are_what_the_binding_reads():
    # Every document of the golden file (written by the Go side's
    # TestWireGolden) has its dataclass, whose WIRE names exactly its fields.
    golden = _golden()
    assert golden.pop("abi_version") == _lib.ABI_VERSION, "the Go side's ABI version differs from the binding's"
    assert set(golden) == set(_wire.GOLDEN)
    for kind, cls in _wire.GOLDEN.items():
        doc = golden[kind]
        assert set(cls.WIRE.values()) == set(doc), kind
        assert set(cls.WIRE) == {f.name for f in dataclasses.fields(cls)}, kind
        assert set(cls.OMITTED) <= set(doc), kind
        assert not any(k[:1].isupper() for k in doc), f"{kind}: an untagged Go field name crossed the ABI"
        got = cls.from_wire(doc)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(got, next(iter(cls.WIRE)), None)
        for attr, name in cls.WIRE.items():
            if isinstance(doc[name], (str, int, float, bool)):
                assert getattr(got, attr) == doc[name], (kind, attr)
    rep = _wire.LoadReport.from_wire(golden["load_report"])
    assert rep.optimizer_loaded is True and rep.lazy_params == ("model.b",) and rep.extra_keys == ("extra",)
    assert rep.byte_values == ({"step": b"10"},)
    info = _wire.CheckpointInfo.from_wire(golden["checkpoint_info"])
    assert info.skipped == (_wire.SkippedCheckpoint(url="file:///r/step-00000011", reason="uncommitted"),)
    res = _wire.ResumeResult.from_wire(golden["resume_result"])
    assert res.skipped == (_wire.ResumeSkip(url="file:///r/step-00000012", reason="checksum", why="damaged"),)
    assert _wire.LoadInfo.from_wire(golden["load_info"]).one_pass is True
    assert _wire.PersistOutcome.from_wire(golden["persist"]).error == "persist failed"


@pytest.mark.parametrize("kind", sorted(_wire.GOLDEN))
def test_a_missing_or_mistyped_field_fails_clearly(kind):
    # No silent default: without a field it is an error naming it, except
    # the fields Go leaves out when empty (omitempty), which read as empty.
    cls = _wire.GOLDEN[kind]
    doc = _golden()[kind]
    for name in doc:
        short = {k: v for k, v in doc.items() if k != name}
        if name in cls.OMITTED:
            got = cls.from_wire(short)
            attr = next(a for a, n in cls.WIRE.items() if n == name)
            assert getattr(got, attr) == cls.OMITTED[name], (kind, name)
            continue
        with pytest.raises(ckptkit.CheckpointError, match=repr(name)) as ei:
            cls.from_wire(short)
        assert ei.value.class_name == "internal"
        wrong = dict(doc, **{name: {"not": "this"}})
        with pytest.raises(ckptkit.CheckpointError, match=repr(name)):
            cls.from_wire(wrong)
    with pytest.raises(ckptkit.CheckpointError, match="not a JSON object"):
        cls.from_wire([doc])


def test_live_json_matches_the_golden_names(tmp_path):
    # The same names come out of the real library, read by the same
    # dataclasses (a missing name would raise).
    import torch
    from ckptkit.torch import Checkpoint, CheckpointInfo, LoadReport, SaveResult, SaverStats, save, step_url
    from ckptkit.torch._async import saver_for
    url = "file://" + str(tmp_path)
    st = ckptkit.Store(url)
    assert isinstance(st.capabilities(), ckptkit.Capabilities)
    st.put("a/b", b"hello")
    assert st.list("a/") == [ckptkit.ObjectInfo(key="a/b", size=5, mtime_ns=st.stat("a/b").mtime_ns)]
    m = torch.nn.Linear(4, 4)
    ck_url = save(url + "/run", m, step=1)
    assert ck_url == step_url(url + "/run", 1)
    with Checkpoint(url + "/run") as ck:
        assert isinstance(ck.info, CheckpointInfo)
        assert (ck.info.url, ck.info.name, ck.info.step, ck.info.none) == (ck_url, "step-00000001", 1, False)
        rep = ck.load({"targets": [{"tensors": [], "bytes": ["step"]}], "quiet": True}, [])
        assert isinstance(rep, LoadReport) and rep.iteration == 1
        assert rep.byte_values == ({"step": b"1"},)
    assert isinstance(saver_for(None).stats(), SaverStats)
    h = save(url + "/run", m, step=2, async_save=True)
    assert h.wait() == step_url(url + "/run", 2)
    assert isinstance(h.result, SaveResult) and h.result.url == h.url and h.result.staging_seconds >= 0
    st.close()


def _s3_parts():
    """(endpoint URL, bucket, query) of the S3 test server."""
    base = os.environ.get("CKPTKIT_TEST_S3_URL") or pytest.skip("CKPTKIT_TEST_S3_URL not set")
    rest = base.split("://", 1)[1]
    bucket, _, query = rest.partition("?")
    params = dict(kv.split("=", 1) for kv in query.split("&") if kv)
    return "http://" + params.pop("endpoint"), bucket.split("/")[0], "&".join(f"{k}={v}" for k, v in params.items()
                                                                                if k != "insecure")


def test_environment_set_after_import_reaches_the_s3_server(tmp_path):
    endpoint, bucket, query = _s3_parts()
    key_id, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    # A process started without any credential or endpoint: they are put
    # into os.environ after import, as a notebook does.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    r = run_py(f'''
import os, uuid, ckptkit
ckptkit.abi_version()  # the library is loaded: its Go runtime copied the environment
url = "s3://{bucket}/env-{{}}?{query}".format(uuid.uuid4().hex[:8])
os.environ["AWS_ENDPOINT_URL_S3"] = "{endpoint}"
os.environ["AWS_ACCESS_KEY_ID"] = "{key_id}"
os.environ["AWS_SECRET_ACCESS_KEY"] = "{secret}"
st = ckptkit.Store(url)
st.put("a", b"hello")
assert st.read("a") == b"hello"
st.close()
os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong-secret"  # takes effect on the next open
try:
    ckptkit.Store(url).read("a")
except ckptkit.AccessError as e:
    print("refused:", e)
else:
    raise AssertionError("a wrong secret was accepted")
os.environ["AWS_SECRET_ACCESS_KEY"] = "{secret}"
st = ckptkit.Store(url)
assert st.read("a") == b"hello"
st.close()
# A shared credentials file named after import, with a profile, instead of
# the keys; its secret changed takes effect on the next open.
del os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
creds = os.path.join({str(tmp_path)!r}, "credentials")
def write(secret):
    with open(creds, "w") as f:
        f.write("[ckpt]\\naws_access_key_id = {key_id}\\naws_secret_access_key = " + secret + "\\n")
write("{secret}")
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = creds
os.environ["AWS_PROFILE"] = "ckpt"
st = ckptkit.Store(url)
assert st.read("a") == b"hello"
st.close()
write("wrong-secret")
try:
    ckptkit.Store(url).read("a")
except ckptkit.AccessError as e:
    print("file refused:", e)
else:
    raise AssertionError("a wrong secret in the credentials file was accepted")
write("{secret}")
st = ckptkit.Store(url)
st.delete("a")
print("ok")
''', env=env)
    assert "refused:" in r.stdout and "file refused:" in r.stdout and "ok" in r.stdout


def test_emulator_host_set_after_import_reaches_the_gcs_emulator():
    base, host = os.environ.get("CKPTKIT_TEST_GCS_URL"), os.environ.get("STORAGE_EMULATOR_HOST")
    if not base or not host:
        if os.environ.get("CI") == "true":
            pytest.fail("CKPTKIT_TEST_GCS_URL / STORAGE_EMULATOR_HOST not set")
        pytest.skip("the GCS emulator is not running (scripts/test-servers.sh)")
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    r = run_py(f'''
import os, uuid, ckptkit
ckptkit.abi_version()
os.environ["STORAGE_EMULATOR_HOST"] = "{host}"
st = ckptkit.Store("{sub_url(base, "env-" + uuid.uuid4().hex[:8])}")
st.put("a", b"hello")
assert st.read("a") == b"hello"
st.delete("a")
print("ok")
''', env=env)
    assert "ok" in r.stdout


def test_forked_child_gets_a_clear_error_and_the_parent_goes_on(tmp_path):
    r = run_py(f'''
import os, sys, time, ckptkit, torch
from ckptkit.torch import save
url = "file://{tmp_path}"
st = ckptkit.Store(url)
st.put("a", b"1")
m = torch.nn.Linear(256, 256)
for inflight in (False, True):
    h = save(url + "/run", m, step=1 + inflight, async_save=True) if inflight else None
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            st.read("a")
        except ckptkit.UsageError as e:
            ok = "fork" in str(e) and "spawn" in str(e) and "forkserver" in str(e)
            ok = ok and time.monotonic() - t0 < 1.0  # the error within a second
            sys.stdout.write(f"child: {{time.monotonic() - t0:.3f}} s: {{e}}\\n")
            sys.stdout.flush()
            # A normal exit: the atexit hooks must not reach the Go core.
            sys.exit(0 if ok else 3)
        sys.exit(4)
    deadline = time.monotonic() + 10
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise AssertionError("the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert st.read("a") == b"1"  # the parent goes on
    if h is not None:
        assert h.wait().endswith("step-00000002")
print("ok")
''')
    assert r.stdout.count("child:") == 2 and "ok" in r.stdout


def test_dataloader_with_fork_workers_next_to_a_live_store(tmp_path):
    r = run_py(f'''
import torch, ckptkit
from torch.utils.data import DataLoader, TensorDataset
st = ckptkit.Store("file://{tmp_path}")
st.put("a", b"1")
dl = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2, multiprocessing_context="fork")
total = sum(float(b[0].sum()) for b in dl)
assert total == sum(range(64)), total
assert st.read("a") == b"1"
st.close()
print("ok")
''', timeout=120)
    assert "ok" in r.stdout


# Ctrl-C (SIGINT) during the long calls of a job against the S3 server, on
# a state of 1 GiB, the signal delivered to the process (as a terminal does)
# or to another thread than the main one: a Python thread (pthread_kill) or
# a thread Python does not know, the Go runtime's or a native library's
# (tgkill). Then the main thread is not woken by the signal: it must not be
# blocked in an untimed wait (ckptkit._lib.POLL_SECONDS).
SIZE = 1 << 30
HOWS = ("process", "thread", "foreign")
LIMIT_SECONDS = 1.0  # the bound

SIGINT_SCRIPT = r"""
import ctypes, os, platform, signal, sys, threading, time, torch, ckptkit
import torch.distributed.checkpoint as dcp
from ckptkit.torch import save, resume, StorageReader, StorageWriter
url, what, how, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
m = torch.nn.Module()
m.w = torch.nn.Parameter(torch.ones(size // 4))
op = "bytes_read" if what in ("resume", "dcp_load") else "bytes_written"
sent = []


def foreign_thread():
    # A thread Python does not know that takes SIGINT (does not block it).
    known = {t.native_id for t in threading.enumerate()}
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        if tid in known:
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                blocked = int(next(x for x in f if x.startswith("SigBlk:")).split()[1], 16)
        except (OSError, StopIteration):
            continue
        if not blocked & (1 << (signal.SIGINT - 1)):
            return tid
    raise SystemExit("no thread outside Python takes SIGINT")


def sender():
    # Once the call has moved 64 MiB (it is well under way), from this
    # thread: to the process, to this thread, or to a foreign one.
    while ckptkit.io_count(op) < (64 << 20):
        time.sleep(0.002)
    tid = foreign_thread() if how == "foreign" else None
    sent.append(time.monotonic())
    if how == "process":
        os.kill(os.getpid(), signal.SIGINT)
    elif how == "thread":
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    else:
        tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
        assert ctypes.CDLL(None, use_errno=True).syscall(tgkill, os.getpid(), tid, signal.SIGINT) == 0


def interrupted_by(e):
    # KeyboardInterrupt, or torch's CheckpointException carrying it (what
    # dcp.save and dcp.load raise for anything a storage layer raises).
    if isinstance(e, KeyboardInterrupt):
        return True
    # failures: rank -> (exception, traceback)
    fails = [f[0] for f in (getattr(e, "failures", None) or {}).values()]
    return bool(fails) and all(isinstance(f, KeyboardInterrupt) for f in fails)


threading.Thread(target=sender, daemon=True).start()
try:
    if what == "resume":
        resume(url, m)
    elif what == "dcp_load":
        dcp.load({"m": m.state_dict()}, storage_reader=StorageReader(url))
    elif what == "dcp_save":
        dcp.save({"m": m.state_dict()}, storage_writer=StorageWriter(url))
    elif what == "async":
        # The signal comes while it stages (in save) or writes (in wait).
        save(url, m, step=1, async_save=True, staging_bytes=64 << 20).wait()
    else:
        save(url, m, step=1)
    print("completed", flush=True)
except BaseException as e:
    if sent and interrupted_by(e):
        print("interrupted", time.monotonic() - sent[0], type(e).__name__, flush=True)
    raise
"""


def _interrupt(url, what, how):
    """Run SIGINT_SCRIPT; return (seconds from the signal to the exception
    reaching the job's code, the CompletedProcess)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), CKPTKIT_IO_COUNT="1")
    r = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT, url, what, how, str(SIZE)], env=env, capture_output=True,
                       text=True, timeout=300)
    line = [x for x in r.stdout.splitlines() if x.startswith("interrupted")]
    assert line, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.returncode != 0 and "completed" not in r.stdout, (r.returncode, r.stdout)
    assert "KeyboardInterrupt" in r.stderr, r.stderr[-3000:]
    return float(line[0].split()[1]), r


def _ckpt(*args):
    """The ckpt CLI's --json document for args."""
    r = subprocess.run([os.environ.get("CKPTKIT_CKPT_BIN") or os.path.join(REPO, "bin", "ckpt"), *args, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (args, r.stdout, r.stderr[-2000:])
    return json.loads(r.stdout)


def _nothing_committed_nor_in_flight(run_url, ckpt_url):
    """Assert that the checkpoint at ckpt_url is not committed and that no
    incomplete upload is left under run_url (ckpt ls lists them: multipart
    uploads on S3)."""
    from ckptkit.torch import Checkpoint
    try:
        with Checkpoint(ckpt_url) as ck:
            assert ck.none, ck.info
    except (ckptkit.IncompleteError, ckptkit.NotFoundError):
        pass  # data objects, never committed; or nothing at all
    doc = _ckpt("ls", run_url)
    assert doc["incomplete_uploads"]["count"] == 0, doc["incomplete_uploads"]


def _remove_all(url):
    st = ckptkit.Store(url)
    for o in st.list():
        st.delete(o.key)
    st.close()


@pytest.fixture
def s3_run():
    """A fresh prefix on the S3 server holding one marker object (so that
    `ckpt ls` lists it), removed at the end."""
    url = s3_url()
    st = ckptkit.Store(url)
    st.put("marker", b"x")
    st.close()
    yield url
    _remove_all(url)


@pytest.fixture(scope="module")
def saved_1gib():
    """{"resume": a run, "dcp_load": a DCP checkpoint} of the 1 GiB state
    SIGINT_SCRIPT loads, saved once on the S3 server, removed at the end."""
    import torch
    import torch.distributed.checkpoint as dcp
    from ckptkit.torch import StorageWriter, save
    base = s3_url()
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.ones(SIZE // 4))
    urls = {"resume": sub_url(base, "run"), "dcp_load": sub_url(base, "dcp")}
    save(urls["resume"], m, step=1)
    dcp.save({"m": m.state_dict()}, storage_writer=StorageWriter(urls["dcp_load"]))
    del m
    yield urls
    _remove_all(base)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("what", ["sync", "async", "dcp_save"])
def test_sigint_during_a_1gib_save_to_s3_stops_it_within_a_second(what, how, s3_run):
    url = sub_url(s3_run, "ckpt") if what == "dcp_save" else s3_run
    took, r = _interrupt(url, what, how)
    assert took < LIMIT_SECONDS, f"{what}, signal to the {how}: KeyboardInterrupt {took:.3f} s after SIGINT"
    _nothing_committed_nor_in_flight(s3_run, url if what == "dcp_save" else sub_url(s3_run, "step-00000001"))


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("what", ["resume", "dcp_load"])
def test_sigint_during_a_1gib_load_from_s3_stops_it_within_a_second(what, how, saved_1gib):
    took, r = _interrupt(saved_1gib[what], what, how)
    assert took < LIMIT_SECONDS, f"{what}, signal to the {how}: KeyboardInterrupt {took:.3f} s after SIGINT"


def test_sigterm_handler_raising_canceled_error_stops_a_save(tmp_path):
    # CanceledError from a signal handler cancels like Ctrl-C.
    r = run_py(f'''
import os, signal, threading, time, ckptkit
st = ckptkit.Store("file://{tmp_path}")
def handler(*_):
    raise ckptkit.CanceledError("SIGTERM")
signal.signal(signal.SIGTERM, handler)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
data = bytearray(64 << 20)
t0 = time.monotonic()
try:
    while True:
        st.put("big", [data] * 16)  # 1 GiB a put: interrupted in one
except ckptkit.CanceledError as e:
    print("canceled", time.monotonic() - t0, e)
''')
    assert "canceled" in r.stdout and "SIGTERM" in r.stdout


FAILING_LAST_SAVE = r'''
import os, resource, signal, sys, torch, ckptkit
from ckptkit.torch import save
url, mode = sys.argv[1], sys.argv[2]
m = torch.nn.Module()
m.w = torch.nn.Parameter(torch.randn(16 << 20))  # 64 MiB
# A disk that refuses the data object 40 MiB into its write (EFBIG), even
# as root: staged, save returns, the write fails in the background.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (40 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
h = save(url, m, step=1, async_save=True)
print("returned", flush=True)
if mode == "close":
    try:
        ckptkit.torch.close()
    except ckptkit.CheckpointError as e:
        print("raised:", e, flush=True)
        sys.exit(0)
    sys.exit(9)
# mode "exit": the job ends "successfully" right after its last save
'''


def test_a_failed_last_async_save_is_raised_from_close(tmp_path):
    r = subprocess.run([sys.executable, "-c", FAILING_LAST_SAVE, "file://" + str(tmp_path), "close"],
                       env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "raised:" in r.stdout and "step-00000001" in r.stdout


def test_a_failed_last_async_save_at_exit_is_logged_and_the_exit_code_is_not_0(tmp_path):
    r = subprocess.run([sys.executable, "-c", FAILING_LAST_SAVE, "file://" + str(tmp_path), "exit"],
                       env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")), capture_output=True, text=True,
                       timeout=120)
    assert "returned" in r.stdout
    assert r.returncode != 0, (r.stdout, r.stderr[-3000:])
    assert "last asynchronous save failed" in r.stderr and "step-00000001" in r.stderr, r.stderr[-3000:]
    from ckptkit.torch import Checkpoint
    with Checkpoint("file://" + str(tmp_path)) as ck:
        assert ck.none, ck.info

"""Overlapped asynchronous saves (issue 26): ckptkit.torch.save(...,
async_save=True) returns once the save is planned and stages while the
caller computes (AsyncSave.staged, wait_staged()); failures while staging
and while uploading surface on wait() and on the next save; cancelling
aborts staging. And torch's own async machinery around ckptkit's storage
layer: dcp.async_save with DefaultStager's background staging, in a thread
and in torch's checkpoint process (which pickles StorageWriter).

On the S3 test server the uploads go through a small proxy of the test
that holds (or refuses) every PUT while the test says so: a state larger
than the staging budget then cannot finish staging, which makes "save
returned while staging" deterministic."""

import contextlib
import http.client
import http.server
import os
import pickle
import signal
import socket
import sys
import threading
import time
import uuid

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageReader, StorageWriter, close, resume, save, step_url

from conftest import sub_url
from models import make, snapshot, train
from test_async import _bits, _check_resumes_to, _file_size_limit, _mutate_everything, _trained_with_ballast
from test_dcp import _zeros_like

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")


def _s3_base():
    url = os.environ.get("CKPTKIT_TEST_S3_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("CKPTKIT_TEST_S3_URL is not set")
        pytest.skip("CKPTKIT_TEST_S3_URL not set (start the servers: scripts/test-servers.sh)")
    return url


class _Proxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy in front of the S3 test server. PUT and POST requests
    wait while `hold` is clear (`held` is set once one waits), and are
    answered 403 AccessDenied while `refuse` is set; the rest pass."""

    daemon_threads = True

    def __init__(self, upstream):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.hold = threading.Event()
        self.hold.set()  # set: nothing is held
        self.held = threading.Event()
        self.refuse = threading.Event()


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        srv = self.server
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        if self.command in ("PUT", "POST"):
            if not srv.hold.is_set():
                srv.held.set()
                srv.hold.wait()
            if srv.refuse.is_set():
                msg = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>' \
                      b'<Message>refused by the test proxy</Message></Error>'
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
        conn = http.client.HTTPConnection(*srv.upstream, timeout=120)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() not in ("connection", "expect"):
                    conn.putheader(k, v)
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        # A HEAD answer has the object's length and no body.
        length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


def _remove_prefix(url):
    with ckptkit.Store(url) as st:
        for e in st.list(""):
            st.delete(e.key)


@pytest.fixture
def s3_proxy():
    """(URL of a fresh prefix reached through the proxy, the proxy)."""
    base = _s3_base()
    head, _, query = base.partition("?")
    params = dict(kv.split("=", 1) for kv in query.split("&") if kv)
    host, port = params["endpoint"].rsplit(":", 1)
    proxy = _Proxy((host, int(port)))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    params["endpoint"] = f"127.0.0.1:{proxy.server_address[1]}"
    url = sub_url(head + "?" + "&".join(f"{k}={v}" for k, v in params.items()), f"pytest-{uuid.uuid4().hex[:12]}")
    try:
        yield url, proxy
    finally:
        proxy.refuse.clear()
        proxy.hold.set()
        try:
            _remove_prefix(url)
        finally:
            proxy.shutdown()
            proxy.server_close()


def test_overlapped_save_returns_while_staging_and_commits_pre_mutation_values(s3_proxy):
    url, proxy = s3_proxy
    m, opt, sched, ballast = _trained_with_ballast(16)
    want, want_ballast = snapshot(m, opt), ballast.clone()
    proxy.hold.clear()
    # 16 MiB through a 4 MiB budget: staging needs uploads to drain, and
    # the proxy holds them, so save() can only have returned while staging.
    h = save(url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True,
             staging_bytes=4 << 20)
    proxy.held.wait()
    assert h.status == "staging" and not h.staged.done()
    with pytest.raises(TimeoutError, match="still staging"):
        h.wait_staged(timeout=0.01)
    proxy.hold.set()
    h.wait_staged()
    assert h.staged.done() and h.status in ("staged", "committed")
    _mutate_everything(m, opt, ballast)  # the optimizer step of the loop
    assert h.wait() == step_url(url, 3)
    # The call returned before staging ended: staging (from the end of the
    # wait for the previous save) outlasted the call.
    r = h.result
    assert r is not None and r.staging_seconds + r.waited_seconds > r.stall_seconds
    _check_resumes_to(url, want, want_ballast)


def test_cancel_aborts_staging_and_commits_nothing(s3_proxy):
    url, proxy = s3_proxy
    m, opt, sched, ballast = _trained_with_ballast(16)
    proxy.hold.clear()
    h = save(url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True,
             staging_bytes=4 << 20)
    proxy.held.wait()
    h.cancel()
    h.wait_staged()  # the tensors are free once the save stops
    with pytest.raises(ckptkit.CanceledError):
        h.wait()
    assert h.status == "failed"
    proxy.hold.set()
    # Reported once more by the next save, which does not start.
    with pytest.raises(ckptkit.CanceledError, match="previous save failed"):
        save(url, m, opt, step=4, scheduler=sched, async_save=True, staging_bytes=4 << 20)
    assert resume(url, *make(seed=2)[:2]) is None  # nothing committed: a fresh start
    assert save(url, m, opt, step=4, scheduler=sched, async_save=True, staging_bytes=4 << 20).wait() == step_url(url, 4)


def _interrupt_main_once_in(func_name):
    """A thread that sends SIGINT to the main thread once the main thread is
    inside func_name (its stack observed, not timed)."""
    main = threading.main_thread().ident

    def run():
        while True:
            f = sys._current_frames().get(main)
            while f is not None and f.f_code.co_name != func_name:
                f = f.f_back
            if f is not None:
                break
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_ctrl_c_in_wait_staged_aborts_the_save_once_the_tensors_are_free(s3_proxy):
    url, proxy = s3_proxy
    m, opt, sched, ballast = _trained_with_ballast(16)
    proxy.hold.clear()
    h = save(url, m, opt, step=3, scheduler=sched, extra_state={"ballast": ballast}, async_save=True,
             staging_bytes=4 << 20)
    proxy.held.wait()
    t = _interrupt_main_once_in("wait_staged")
    with pytest.raises(KeyboardInterrupt):
        h.wait_staged()  # staging cannot end while the proxy holds the uploads
    t.join()
    assert h.staged.done(), "the interrupt propagates once the save no longer reads the tensors"
    with pytest.raises(ckptkit.CanceledError):
        h.wait()
    proxy.hold.set()
    assert resume(url, *make(seed=2)[:2]) is None  # nothing committed
    with pytest.raises(ckptkit.CanceledError):  # the saver still reports it, once
        close()


@contextlib.contextmanager
def _failing(backend, url, proxy):
    """Every data write of a save to url fails while inside."""
    if backend == "file":
        # Objects are at least 256 KiB here: every one is refused.
        with _file_size_limit(128 << 10):
            yield "file too large"
        return
    proxy.refuse.set()
    try:
        yield "refused by the test proxy"
    finally:
        proxy.refuse.clear()


@pytest.mark.parametrize("phase", ["staging", "upload"])
@pytest.mark.parametrize("backend", ["file", "s3"])
def test_failure_while_staging_or_uploading_surfaces_on_wait_and_on_the_next_save(backend, phase, request, tmp_path):
    if backend == "file":
        url, proxy = "file://" + str(tmp_path), None
    else:
        url, proxy = request.getfixturevalue("s3_proxy")
    m, opt, sched, ballast = _trained_with_ballast(16)
    # staging: 16 MiB through a 2 MiB budget, so the uploads that fail are
    # the ones staging waits on; upload: everything staged first (the
    # uploads wait until it is), then the uploads fail.
    budget = 2 << 20 if phase == "staging" else 64 << 20
    opts = dict(scheduler=sched, async_save=True, staging_bytes=budget)
    with _failing(backend, url, proxy) as why:
        h = save(url, m, opt, step=3, extra_state={"ballast": ballast}, **opts)
        h.wait_staged()  # the tensors are free either way
        with pytest.raises(ckptkit.CheckpointError) as e:
            h.wait()
        assert why in str(e.value) and "step-00000003" in str(e.value)
        assert h.status == "failed" and h.staged.done()
        with pytest.raises(type(e.value)):  # wait() does not consume it
            h.wait()
        with pytest.raises(type(e.value), match="previous save failed") as nxt:
            save(url, m, opt, step=4, **opts)
        assert "step-00000003" in str(nxt.value)
    # The one after runs; nothing of step 3 was committed.
    assert save(url, m, opt, step=4, extra_state={"ballast": ballast}, **opts).wait() == step_url(url, 4)
    rep = resume(url, *make(seed=2)[:2], extra_state={"ballast": torch.zeros_like(ballast)})
    assert rep.step == 4 and not rep.skipped


# -- pickling the storage layer ------------------------------------------------


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g),
            "nested": {"x": torch.randn(1000, generator=g).to(torch.bfloat16), "step": seed}}


def _clone(sd):
    return {k: (_clone(v) if isinstance(v, dict) else v.clone() if torch.is_tensor(v) else v) for k, v in sd.items()}


def _mutate(sd):
    with torch.no_grad():
        sd["w"].add_(1.0)
        sd["b"].neg_()
        sd["nested"]["x"].zero_()


def _assert_bits_equal(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, dict):
            _assert_bits_equal(got[k], v)
        elif torch.is_tensor(v):
            assert got[k].dtype == v.dtype and _bits(got[k]) == _bits(v), k
        else:
            assert got[k] == v, k


def _load(url, like, reader=None):
    out = _zeros_like(like)
    dcp.load(out, storage_reader=reader or StorageReader(url))
    return out


def test_storage_writer_and_reader_pickle_and_reopen_their_store(base_url):
    sd = _state(1)
    w = StorageWriter(sub_url(base_url, "a"), concurrency=3, part_size=1 << 20)
    dcp.save(sd, storage_writer=w)  # the writer now holds an open store
    w2 = pickle.loads(pickle.dumps(w))
    assert (w2.url, w2.concurrency, w2.part_size, w2._store) == (w.url, 3, 1 << 20, None)
    sd2 = _state(2)
    dcp.save(sd2, storage_writer=w2, checkpoint_id=sub_url(base_url, "b"))
    r = StorageReader(sub_url(base_url, "b"))
    r.read_metadata()  # the reader now holds an open checkpoint
    r2 = pickle.loads(pickle.dumps(r))
    _assert_bits_equal(_load(None, sd2, r2), sd2)
    _assert_bits_equal(_load(sub_url(base_url, "a"), sd), sd)


# -- dcp.async_save with DefaultStager, thread and process executors ----------

try:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
except ImportError:  # torch < 2.9: no DefaultStager, no checkpoint process
    DefaultStager = StagingOptions = AsyncCheckpointerType = None

_needs_stager = pytest.mark.skipif(DefaultStager is None,
                                   reason=f"torch {torch.__version__} has no DefaultStager / AsyncCheckpointerType")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo():
    """A one-rank gloo process group (torch's checkpoint process joins a
    group of its own through it)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@_needs_stager
@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("backend", ["file", "s3"])
def test_dcp_async_save_with_default_stager_reused_over_three_saves(backend, executor, tmp_path, gloo):
    if backend == "file":
        base = "file://" + str(tmp_path)
    else:
        base = sub_url(_s3_base(), f"pytest-{uuid.uuid4().hex[:12]}")
    typ = AsyncCheckpointerType.PROCESS if executor == "process" else AsyncCheckpointerType.THREAD
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=executor == "process",
                                          use_async_staging=True, use_non_blocking_copy=False))
    writer = StorageWriter(sub_url(base, "step-0"))
    sd = _state(7)
    wants, pending = [], None
    try:
        for i in range(3):
            url = sub_url(base, f"step-{i}")
            wants.append(_clone(sd))
            # torchtitan's loop: a save first waits for the previous upload
            # (the writer is reused), returns at once, forward and backward
            # run, and the loop waits for staging right before the
            # optimizer step, which changes every tensor.
            if pending is not None:
                pending.result()
            resp = dcp.async_save(sd, checkpoint_id=url, storage_writer=writer, async_stager=stager,
                                  async_checkpointer_type=typ)
            resp.staging_completion.result()
            _mutate(sd)
            pending = resp.upload_completion
        pending.result()
    finally:
        stager.close()
    for i, want in enumerate(wants):
        _assert_bits_equal(_load(sub_url(base, f"step-{i}"), want), want)
    if backend == "s3":
        _remove_prefix(base)

"""ckptkit.Store through libckptkit on every backend: round trips, error
classes, create-if-absent, the GIL released during calls, no leaks."""

import os
import threading
import time

import pytest

import ckptkit
from ckptkit import errors


def test_abi_version_matches():
    assert ckptkit.abi_version() == ckptkit._lib.ABI_VERSION


def test_round_trip(base_url):
    st = ckptkit.Store(base_url)
    data = os.urandom(300_000)
    total, parts = st.put("dir/obj", [data[:1000], bytearray(data[1000:])])
    assert total == ckptkit.crc32c(data)
    assert parts == [ckptkit.crc32c(data[:1000]), ckptkit.crc32c(data[1000:])]
    assert st.read("dir/obj") == data
    assert st.read("dir/obj", 12345, 100) == data[12345:12445]
    buf = bytearray(5000)
    assert st.read_into("dir/obj", 7, buf) == ckptkit.crc32c(data[7:5007])
    assert bytes(buf) == data[7:5007]
    size, _, _ = st.stat("dir/obj")
    assert size == len(data)
    st.put("dir/a", b"")
    assert [o.key for o in st.list("dir/")] == ["dir/a", "dir/obj"]
    st.delete("dir/obj")
    st.delete("dir/obj")  # deleting a missing key succeeds
    assert not st.exists("dir/obj")
    st.close()


def test_errors_carry_class_and_message(base_url):
    st = ckptkit.Store(base_url)
    with pytest.raises(ckptkit.NotFoundError) as e:
        st.read("missing", 0, 4)
    assert e.value.cls == errors.NOT_FOUND and "missing" in str(e.value)
    with pytest.raises(ckptkit.NotFoundError):
        st.stat("missing")
    with pytest.raises(ckptkit.UsageError) as e:
        st.put("../escape", b"x")
    assert e.value.cls == errors.USAGE
    st.put("short", b"abc")
    with pytest.raises(ckptkit.CheckpointError) as e:
        st.read("short", 1, 10)
    assert "short" in str(e.value) and "offset 1" in str(e.value)
    with pytest.raises(ckptkit.UsageError):
        ckptkit.Store("nosuchscheme://x")


def test_create_if_absent(base_url):
    st = ckptkit.Store(base_url)
    if not st.capabilities()["create_if_absent"]:
        with pytest.raises(ckptkit.UnsupportedError):
            st.put("k", b"1", if_absent=True)
        return
    st.put("k", b"first", if_absent=True)
    with pytest.raises(ckptkit.ConflictError) as e:
        st.put("k", b"second", if_absent=True)
    assert e.value.cls == errors.CONFLICT
    assert st.read("k") == b"first"


def test_gil_is_released_during_calls(file_url):
    """A long put in one thread must not stop Python in another."""
    st = ckptkit.Store(file_url)
    data = bytearray(256 << 20)
    inside = threading.Event()
    done = threading.Event()
    span = {}

    def put():
        inside.set()
        t0 = time.perf_counter()
        st.put("big", data)
        span["call"] = time.perf_counter() - t0
        done.set()

    th = threading.Thread(target=put)
    th.start()
    inside.wait()
    ticks = 0
    while not done.is_set():
        ticks += 1
    th.join()
    # With the GIL held for the call this loop would get (almost) no turns.
    assert span["call"] > 0.02, span
    assert ticks > 10_000, (ticks, span)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_leaks_over_thousands_of_calls(base_url):
    st = ckptkit.Store(base_url)
    payload = os.urandom(4096)
    buf = bytearray(4096)

    def round_(i):
        st.put(f"leak/{i % 7}", payload)
        st.read_into(f"leak/{i % 7}", 0, buf)
        st.stat(f"leak/{i % 7}")
        if i % 10 == 0:
            st.list("leak/")
        try:
            st.read("leak/none", 0, 1)
        except ckptkit.NotFoundError:
            pass
        if i % 50 == 0:
            ckptkit.Store(base_url).close()

    for i in range(300):
        round_(i)
    fds, gor, rss = _fds(), ckptkit.goroutines(), _rss_kib()
    n = 3000
    for i in range(n):
        round_(i)
    st.close()
    # Idle keep-alive connections of the HTTP backends come and go.
    slack = 2 if base_url.startswith(("file:", "mem:")) else 16
    assert _fds() <= fds + slack, (fds, _fds())
    assert ckptkit.goroutines() <= gor + slack, (gor, ckptkit.goroutines())
    assert _rss_kib() - rss < 32 * 1024, (rss, _rss_kib())


def test_calls_from_many_threads_at_once(base_url):
    st = ckptkit.Store(base_url)
    errors_seen = []

    def work(t):
        try:
            for i in range(40):
                data = os.urandom(1000 + t * 10 + i)
                total, _ = st.put(f"t{t}/{i}", data)
                buf = bytearray(len(data))
                assert st.read_into(f"t{t}/{i}", 0, buf) == total
                assert bytes(buf) == data
        except Exception as e:  # reported below, with the thread
            errors_seen.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors_seen
    assert len(st.list("t")) == 8 * 40


def test_read_segments_returns_each_segments_crc32c(base_url):
    # Segments straddling the Go core's 256 KiB read pieces, an empty one
    # between them, and a short tail: each CRC32C is the segment's.
    st = ckptkit.Store(base_url)
    data = os.urandom(700_000)
    st.put("obj", data)
    lens = [300_000, 0, 262_144, 37_000]
    start = 1_000
    buf = bytearray(sum(lens))
    crcs = st.read_segments("obj", start, buf, lens)
    assert bytes(buf) == data[start:start + sum(lens)]
    pos, want = start, []
    for n in lens:
        want.append(ckptkit.crc32c(data[pos:pos + n]))
        pos += n
    assert crcs == want
    with pytest.raises(ckptkit.UsageError):
        st.read_segments("obj", 0, bytearray(10), [4, 5])
    with pytest.raises(ckptkit.NotFoundError):
        st.read_segments("missing", 0, bytearray(4), [4])
    st.close()


def test_read_from_an_offset_transfers_only_the_rest(base_url, monkeypatch):
    # Counted at the backend: stores opened with CKPTKIT_IO_COUNT=1 in the
    # environment of the open (set here, after import) count their bytes.
    monkeypatch.setenv("CKPTKIT_IO_COUNT", "1")
    st = ckptkit.Store(base_url)
    data = os.urandom(1 << 20)
    st.put("obj", data)
    for off in (0, 1, 1000, len(data) - 1, len(data), len(data) + 5):
        before = ckptkit.io_count("bytes_read")
        assert st.read("obj", off) == data[off:]
        assert ckptkit.io_count("bytes_read") - before == max(0, len(data) - off), f"offset {off}"
    with pytest.raises(errors.UsageError):
        st.read("obj", -1)
    st.close()


def test_read_into_refuses_a_read_only_buffer_before_any_copy(file_url):
    import tracemalloc
    st = ckptkit.Store(file_url)
    st.put("obj", b"x" * 100)
    big = memoryview(bytearray(64 << 20)).toreadonly()
    tracemalloc.start()
    try:
        with pytest.raises(errors.UsageError, match="read-only"):
            st.read_into("obj", 0, big)
        with pytest.raises(errors.UsageError, match="read-only"):
            st.read_segments("obj", 0, big, [len(big)])
        with pytest.raises(errors.UsageError, match="read-only"):
            st.read_into("obj", 0, b"x" * 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated refusing a 64 MiB read-only buffer"
    st.close()

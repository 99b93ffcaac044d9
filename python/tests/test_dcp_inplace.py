"""StorageReader reads each large tensor's stored bytes straight into its
target (no read buffer, no second copy) and still checks every byte."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptkit
from ckptkit.torch import StorageReader, StorageWriter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is unavailable")

MiB = 1 << 20


def _big_state(total, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    per = total // n // 4
    sd = {f"layer{i}.weight": torch.randn(per // 256, 256, generator=g) for i in range(n)}
    sd["half"] = torch.randn(1024, 1024, generator=g).to(torch.bfloat16)  # 2 MiB of another dtype
    sd["small"] = torch.randn(17, generator=g)  # below in_place_min: buffered
    sd["step"] = 7
    return sd


def _touched_zeros(sd):
    return {k: torch.zeros_like(v) if torch.is_tensor(v) else None for k, v in sd.items()}


def _tensor_bytes(sd, at_least=0):
    return sum(v.numel() * v.element_size() for v in sd.values()
               if torch.is_tensor(v) and v.numel() * v.element_size() >= at_least)


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} not in /proc/self/status")


def _reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux clear_refs 5), or skip."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS here: {e}")


def test_a_256_mib_load_lands_in_place(file_url):
    url = file_url + "/ck"
    sd = _big_state(256 * MiB)
    dcp.save(sd, storage_writer=StorageWriter(url))
    out = _touched_zeros(sd)
    ptrs = {k: v.data_ptr() for k, v in out.items() if torch.is_tensor(v)}
    reader = StorageReader(url)
    reader.read_metadata()  # open and read the integrity object before measuring
    _reset_peak_rss()
    base = _status("VmRSS")
    dcp.load(out, storage_reader=reader)
    extra = _status("VmHWM") - base
    for k, v in sd.items():
        if torch.is_tensor(v):
            assert torch.equal(out[k], v), k
            assert out[k].data_ptr() == ptrs[k], k  # loaded into the given tensor
    assert out["step"] == 7
    st = reader.last_read_stats
    # Every tensor of at least in_place_min bytes was read into its target;
    # only the small ones went through a buffer.
    assert st["in_place_items"] == 17
    assert st["in_place_bytes"] == _tensor_bytes(sd, reader.in_place_min)
    assert st["buffered_bytes"] < 64 << 10, st
    # Memory beyond the targets: the zip headers around each tensor, the
    # small items' buffer, Python objects; never a tensor's size.
    assert extra < 16 * MiB, f"load of 258 MiB grew the peak RSS by {extra / MiB:.1f} MiB ({st})"


def _flip(path, key, where):
    """Flip one byte of key's stored item: "data" inside the tensor bytes,
    "head" in the zip header before them (its first record's name), "tail"
    in the zip directory after them. Returns (object, offset of the item)."""
    md = dcp.FileSystemReader(path).read_metadata()
    (info,) = [s for i, s in md.storage_data.items() if i.fqn == key]
    at = info.offset + {"data": info.length // 2, "head": 40, "tail": info.length - 30}[where]
    with open(os.path.join(path, info.relative_path), "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))
    return info.relative_path, info.offset


@pytest.mark.parametrize("where", ["data", "head", "tail"])
def test_flipped_byte_fails_naming_key_object_and_offset(file_url, where):
    path = file_url[len("file://"):] + "/ck"
    sd = _big_state(16 * MiB, n=4, seed=1)
    dcp.save(sd, storage_writer=StorageWriter(file_url + "/ck"))
    obj, off = _flip(path, "layer2.weight", where)
    out = _touched_zeros(sd)
    reader = StorageReader(file_url + "/ck")
    with pytest.raises(BaseException) as e:  # dcp.CheckpointException is a BaseException
        dcp.load(out, storage_reader=reader)
    failures = getattr(e.value, "failures", None)
    err = next(iter(failures.values())) if failures else e.value
    err = err[0] if isinstance(err, tuple) else err
    assert isinstance(err, ckptkit.ChecksumError), repr(e.value)
    msg = str(err)
    assert "'layer2.weight'" in msg and obj in msg and f"at offset {off} " in msg, msg
    if where != "head":
        # Found by the in-place read, before any buffered one (a broken
        # head sends the item through a buffer, where it fails the same way).
        assert reader.last_read_stats["buffered_items"] == 0, reader.last_read_stats


def test_torch_written_items_land_in_place(file_url):
    # torch's own FileSystemWriter: its torch.save layout, no CRC32Cs.
    path = file_url[len("file://"):] + "/ck"
    sd = _big_state(16 * MiB, n=4, seed=2)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
    out = _touched_zeros(sd)
    reader = StorageReader(file_url + "/ck")
    dcp.load(out, storage_reader=reader)
    for k, v in sd.items():
        if torch.is_tensor(v):
            assert torch.equal(out[k], v), k
    assert reader.last_read_stats["in_place_items"] == 5
    assert reader.last_read_stats["in_place_bytes"] == _tensor_bytes(sd, reader.in_place_min)


def test_layouts_that_cannot_land_in_place_are_read_through_a_buffer(file_url):
    url = file_url + "/ck"
    g = torch.Generator().manual_seed(3)
    sd = {
        "transposed": torch.randn(512, 1024, generator=g).t(),  # stored with its transposed strides
        "plain": torch.randn(512, 1024, generator=g),
        "to_double": torch.randn(512, 1024, generator=g),
        "into_view": torch.randn(512, 1024, generator=g),
    }
    dcp.save(sd, storage_writer=StorageWriter(url))
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    out["to_double"] = torch.zeros(512, 1024, dtype=torch.float64)  # another dtype: converted by copy_
    out["into_view"] = torch.zeros(1024, 512).t()  # a non-contiguous target
    reader = StorageReader(url)
    dcp.load(out, storage_reader=reader)
    for k, v in sd.items():
        assert torch.equal(out[k].to(v.dtype), v), k
    st = reader.last_read_stats
    assert st["in_place_items"] == 1 and st["in_place_bytes"] == 2 * MiB, st
    assert st["buffered_items"] == 3, st


def test_storage_writer_starts_every_item_and_tensor_on_a_64_byte_boundary(file_url):
    # Bytes items and tensors of odd sizes first, so that unpadded items
    # would start anywhere: every item must start at a multiple of 64 in its
    # object, and each tensor's storage bytes too (the alignment of a
    # tensor's memory, which the kernel's copies need for full speed).
    from ckptkit.torch._torchsave import locate_storage

    path = file_url[len("file://"):] + "/ck"
    g = torch.Generator().manual_seed(3)
    sd = {"note": "a string of 23 chars...", "step": 11, "odd": torch.randn(17, generator=g),
          "odd2": torch.randn(3, 5, generator=g).to(torch.bfloat16)}
    sd.update({f"w{i}": torch.randn(1 << 18, generator=g) for i in range(3)})
    dcp.save(sd, storage_writer=StorageWriter(file_url + "/ck"))
    md = dcp.FileSystemReader(path).read_metadata()
    tensors = 0
    for idx, info in md.storage_data.items():
        assert info.offset % 64 == 0, (idx.fqn, info.offset)
        if not torch.is_tensor(sd[idx.fqn]):
            continue
        with open(os.path.join(path, info.relative_path), "rb") as fh:
            fh.seek(info.offset)
            loc = locate_storage(fh.read(min(info.length, 4096)))
        assert loc is not None, idx.fqn
        assert (info.offset + loc.start) % 64 == 0, (idx.fqn, info.offset, loc.start)
        tensors += 1
    assert tensors == 5
    # The padding between items is no item's: torch's reader and ours
    # load every value, ours with every item's CRC32C checked.
    for reader in (dcp.FileSystemReader(path), StorageReader(file_url + "/ck")):
        out = {k: torch.zeros_like(v) if torch.is_tensor(v) else None for k, v in sd.items()}
        dcp.load(out, storage_reader=reader)
        for k, v in sd.items():
            assert torch.equal(out[k], v) if torch.is_tensor(v) else out[k] == v, k
    st = reader.last_read_stats
    assert st["in_place_items"] == 3, st
    # The small items, padding between them, go in one buffered read: the
    # heads, the in-place items and it are the load's 3 calls.
    assert st["buffered_items"] == 4 and st["calls"] == 3, st

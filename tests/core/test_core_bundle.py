"""A job's code bundle (peerd.core.bundle): the same files make the same bytes,
any change to the bytes is refused by hash, names that would leave the
directory are refused, and the limits hold."""

from __future__ import annotations

import io
import tarfile
import tracemalloc

import pytest

from peerd.core.bundle import BundleRefused, Limits, check_name, digest, pack, unpack, valid_hash

FILES = {"train.py": b"print('hi')\n", "lab/models.py": b"import torch\n", "lab/__init__.py": b"",
         "configs/base.yaml": b"lr: 0.1\n"}
# The bundle of FILES, as every machine must make it (a change to the format changes this).
FILES_SHA256 = "11846b3c6891e3da9b9771affdd47d4a6a835413f0bc3d49098dbe5ad85e043e"


def test_the_same_files_make_the_same_bytes_whatever_their_order():
    one = pack(FILES)
    other = pack(dict(reversed(list(FILES.items()))))
    assert one == other
    assert valid_hash(digest(one))
    assert unpack(one, digest(one)) == FILES


def test_the_bytes_are_a_plain_tar_of_regular_files_with_no_owner_or_time():
    with tarfile.open(fileobj=io.BytesIO(pack(FILES))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(FILES)
    assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 and not m.uname
               for m in members)


def test_the_hash_is_fixed_for_fixed_files():
    # Machines with other Pythons must agree: the hash is part of the job's fingerprint.
    assert digest(pack(FILES)) == FILES_SHA256
    assert digest(pack({"a.py": b"x = 1\n"})) == digest(pack({"a.py": b"x = 1\n"}))
    assert digest(pack({"a.py": b"x = 1\n"})) != digest(pack({"a.py": b"x = 2\n"}))
    assert digest(pack({"a.py": b"x"})) != digest(pack({"b.py": b"x"}))


@pytest.mark.parametrize("where", [0, 600, -1030])
def test_a_tampered_bundle_is_refused_by_hash(where):
    data = pack(FILES)
    code = digest(data)
    tampered = bytearray(data)
    tampered[where] ^= 0x01
    with pytest.raises(BundleRefused, match=f"not the job's {code}") as refused:
        unpack(bytes(tampered), code)
    assert refused.value.reason == "mismatch"


def test_a_bundle_with_an_extra_byte_is_refused():
    data = pack(FILES)
    with pytest.raises(BundleRefused) as refused:
        unpack(data + b"\0", digest(data))
    assert refused.value.reason == "mismatch"


@pytest.mark.parametrize("name", ["../evil.py", "a/../../evil.py", "/etc/passwd", "a//b.py", "./a.py", "a/./b",
                                  "", "a\\..\\b.py", "bad\nname.py", "x" * 256, "..", "a/.."])
def test_names_that_leave_the_directory_are_refused(name):
    with pytest.raises(BundleRefused) as refused:
        check_name(name)
    assert refused.value.reason == "name"
    with pytest.raises(BundleRefused):
        pack({name: b"x", "ok.py": b""})


def test_a_bundle_whose_names_leave_the_directory_is_refused_even_when_its_hash_matches():
    # Made by hand (pack refuses it): a tar whose member climbs out.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("../outside.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    data = out.getvalue()
    with pytest.raises(BundleRefused) as refused:
        unpack(data, digest(data))
    assert refused.value.reason == "name"


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE])
def test_links_and_directories_in_a_bundle_are_refused(kind):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("link.py")
        info.type, info.linkname = kind, "/etc/passwd"
        tar.addfile(info)
    data = out.getvalue()
    with pytest.raises(BundleRefused, match="not a regular file"):
        unpack(data, digest(data))


def test_a_bundle_packed_otherwise_is_refused_as_not_canonical():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.py")
        info.size, info.mtime = 1, 1234567890  # a real mtime: the same file, other bytes
        tar.addfile(info, io.BytesIO(b"x"))
    data = out.getvalue()
    with pytest.raises(BundleRefused) as refused:
        unpack(data, digest(data))
    assert refused.value.reason == "form"


def test_a_file_that_is_also_a_directory_is_refused():
    with pytest.raises(BundleRefused, match="lies under the file"):
        pack({"lab": b"x", "lab/models.py": b"y"})


def test_size_and_count_limits_are_enforced_with_the_figures():
    with pytest.raises(BundleRefused, match=r"the job's code is 2\.0 MiB, over the limit of 1\.0 MiB") as refused:
        pack({"big.bin": bytes(2 << 20)}, Limits(max_bytes=1 << 20))
    assert refused.value.reason == "size"
    with pytest.raises(BundleRefused, match="3 files, over the limit of 2") as refused:
        pack({"a": b"", "b": b"", "c": b""}, Limits(max_files=2))
    assert refused.value.reason == "files"
    data = pack({"big.bin": bytes(600 << 10)})
    with pytest.raises(BundleRefused, match=r"over the limit of 0\.5 MiB") as refused:
        unpack(data, digest(data), Limits(max_bytes=512 << 10))
    assert refused.value.reason == "size"
    with pytest.raises(BundleRefused, match="over 2 files"):
        data = pack({"a": b"", "b": b"", "c": b""})
        unpack(data, digest(data), Limits(max_files=2))


def test_a_sparse_member_is_refused_before_its_claimed_size_is_read():
    # A few KiB of tar whose one member claims 64 MiB of holes: read back, the
    # holes become zeros in memory, far past the bundle's own size limit.
    claimed = 64 << 20
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.py")
        info.pax_headers = {"GNU.sparse.map": "0,4", "GNU.sparse.size": str(claimed), "GNU.sparse.name": "a.py"}
        info.size = 4
        tar.addfile(info, io.BytesIO(b"x=1\n"))
    data = out.getvalue()
    tracemalloc.start()
    try:
        with pytest.raises(BundleRefused) as refused:
            unpack(data, digest(data), Limits(max_bytes=1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.reason == "form"
    assert peak < claimed // 8

"""The blocking client and its file objects, against real servers."""

import errno
import io
import os
import stat
import threading

import numpy as np
import pytest

import shoal


def test_namespace_calls_round_trip(fs, base):
    fs.mkdir(f"{base}/d", 0o750)
    fs.makedirs(f"{base}/a/b/c")
    fs.makedirs(f"{base}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/a/b/c")
    assert fs.write_bytes(f"{base}/d/f", b"hello") == 5
    assert fs.read_bytes(f"{base}/d/f") == b"hello"
    st = fs.stat(f"{base}/d/f")
    assert st.is_file() and stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
    assert stat.S_ISDIR(fs.stat(f"{base}/d").st_mode) and stat.S_IMODE(fs.stat(f"{base}/d").st_mode) == 0o750
    assert sorted(fs.listdir(base)) == ["a", "d"]
    entries = {e.name: e for e in fs.scandir(base)}
    assert entries["a"].is_dir() and entries["a"].path == f"{base}/a"

    fs.symlink("d/f", f"{base}/ln")
    assert fs.readlink(f"{base}/ln") == "d/f"
    assert fs.lstat(f"{base}/ln").is_symlink() and fs.stat(f"{base}/ln").is_file()
    fs.link(f"{base}/d/f", f"{base}/hard")
    assert fs.stat(f"{base}/d/f").st_nlink == 2

    fs.chmod(f"{base}/d/f", 0o600)
    assert stat.S_IMODE(fs.stat(f"{base}/d/f").st_mode) == 0o600
    fs.utime(f"{base}/d/f", ns=(1_000_000_001, 2_000_000_002))
    st = fs.stat(f"{base}/d/f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_001, 2_000_000_002)
    fs.truncate(f"{base}/d/f", 2)
    assert fs.read_bytes(f"{base}/d/f") == b"he"

    fs.setxattr(f"{base}/d/f", "user.tag", b"v1")
    assert fs.getxattr(f"{base}/d/f", "user.tag") == b"v1"
    assert "user.tag" in fs.listxattr(f"{base}/d/f")
    with pytest.raises(FileExistsError):
        fs.setxattr(f"{base}/d/f", "user.tag", b"v2", os.XATTR_CREATE)
    fs.removexattr(f"{base}/d/f", "user.tag")

    fs.rename(f"{base}/d/f", f"{base}/moved")
    assert not fs.exists(f"{base}/d/f") and fs.exists(f"{base}/moved")
    fs.unlink(f"{base}/moved")
    fs.rmdir(f"{base}/d")
    assert fs.rmtree(base) >= 5
    assert not fs.exists(base)
    s = fs.statfs()
    assert s.servers_up == 3 and s.capacity_bytes > 0


def test_errors_are_the_oserror_subclasses_of_their_errno(fs, base):
    with pytest.raises(FileNotFoundError) as e:
        fs.stat(f"{base}/missing")
    assert e.value.errno == errno.ENOENT and "missing" in str(e.value)
    fs.mkdir(f"{base}/d")
    fs.write_bytes(f"{base}/d/f", b"x")
    with pytest.raises(OSError) as e:
        fs.rmdir(f"{base}/d")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(NotADirectoryError):
        fs.listdir(f"{base}/d/f")
    with pytest.raises(IsADirectoryError):
        fs.unlink(f"{base}/d")
    with pytest.raises(ValueError):
        fs.open(f"{base}/d/f", "rw")
    with pytest.raises(FileNotFoundError):
        shoal.Client("/nonexistent/cluster.toml")


def test_text_and_binary_file_objects_behave_like_pythons_own(fs, base):
    with fs.open(f"{base}/t.txt", "w") as f:
        assert isinstance(f, io.TextIOWrapper)
        for i in range(1000):
            print(f"line {i}", file=f)
    with fs.open(f"{base}/t.txt") as f:
        lines = f.readlines()
    assert len(lines) == 1000 and lines[999] == "line 999\n"

    with fs.open(f"{base}/b.bin", "wb") as f:
        assert isinstance(f, io.BufferedWriter)
        f.write(b"a" * 100_000)
        f.write(memoryview(b"tail"))
    with fs.open(f"{base}/b.bin", "rb") as f:
        assert f.seek(-4, io.SEEK_END) == 100_000
        assert f.read() == b"tail"
        f.seek(10)
        assert f.read(3) == b"aaa" and f.tell() == 13
    with fs.open(f"{base}/b.bin", "r+b") as f:
        f.seek(2)
        f.write(b"ZZ")
        f.truncate(6)
    assert fs.read_bytes(f"{base}/b.bin") == b"aaZZaa"
    with fs.open(f"{base}/b.bin", "ab") as f:
        f.write(b"++")
    assert fs.read_bytes(f"{base}/b.bin") == b"aaZZaa++"
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/b.bin", "x")
    raw = fs.open(f"{base}/b.bin", "rb", buffering=0)
    assert isinstance(raw, shoal.RawFile) and raw.read(2) == b"aa"
    raw.close()
    with pytest.raises(ValueError):
        raw.read(1)
    with fs.open(f"{base}/b.bin", "rb") as f, pytest.raises(io.UnsupportedOperation):
        f.write(b"no")


def test_readinto_fills_numpy_arrays_in_place(fs, base):
    data = np.arange(1 << 20, dtype=np.float64)  # 8 MiB over 3 servers
    with fs.open(f"{base}/arr", "wb") as f:
        f.write(data)  # the buffer protocol, no tobytes()
    out = np.empty_like(data)
    with fs.open(f"{base}/arr", "rb", buffering=0) as f:
        view = memoryview(out).cast("B")
        got = 0
        while got < view.nbytes:
            n = f.readinto(view[got:])
            assert n > 0
            got += n
    assert np.array_equal(out, data)
    native = fs.open_file(f"{base}/arr", "r")
    part = np.zeros(10, dtype=np.float64)
    assert native.preadinto(part, 8 * 100) == 80
    assert list(part) == list(range(100, 110))
    with pytest.raises(ValueError):
        native.preadinto(b"read-only", 0)
    native.close()


def test_threads_overlap_their_calls(fs, base):
    # Calls release the GIL: 8 threads each write and read back their own file.
    errors = []

    def work(i):
        try:
            payload = os.urandom(300_000)
            fs.write_bytes(f"{base}/f{i}", payload)
            assert fs.read_bytes(f"{base}/f{i}") == payload
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(fs.listdir(base)) == 8


def test_list_io_moves_many_pieces_in_one_call(fs, base):
    f = fs.open_file(f"{base}/strided", "w+")
    pieces = [(i * 8192, bytes([i % 251]) * 4096) for i in range(2000)]
    assert f.write_list(pieces) == 2000 * 4096
    got = f.read_list([(off, 4096) for off, _ in pieces])
    assert got == [data for _, data in pieces]
    # Holes read as zeros; past the end, short.
    assert f.read_list([(4096, 8), (2000 * 8192, 10)]) == [bytes(8), b""]
    f.close()

"""Client.find and AsyncClient.find (docs/find.md): a metadata query answered by every
server, with find(1)'s tests as keyword arguments, against real servers."""

import asyncio

import pytest

import shoal


def test_find_answers_find_s_tests(fs, base):
    fs.makedirs(f"{base}/a/b")
    fs.write_bytes(f"{base}/x.h5", b"")
    fs.write_bytes(f"{base}/a/y.H5", b"z" * 3000)
    fs.write_bytes(f"{base}/a/b/notes.txt", b"hello")
    fs.chmod(f"{base}/a/b/notes.txt", 0o600)
    fs.setxattr(f"{base}/a/y.H5", "user.tag", b"hot")

    found = fs.find(base)
    assert [p for p, _ in found] == [base, f"{base}/a", f"{base}/a/b", f"{base}/a/b/notes.txt",
                                     f"{base}/a/y.H5", f"{base}/x.h5"]
    paths = lambda **tests: [p for p, _ in fs.find(base, **tests)]
    assert paths(name="*.h5") == [f"{base}/x.h5"]
    assert paths(iname="*.h5") == [f"{base}/a/y.H5", f"{base}/x.h5"]
    assert paths(type="d") == [base, f"{base}/a", f"{base}/a/b"]
    assert paths(type="f", size="+2k") == [f"{base}/a/y.H5"]
    assert paths(type="f", size="-1k") == [f"{base}/x.h5"]
    assert paths(perm=0o600) == [f"{base}/a/b/notes.txt"]
    assert paths(perm="-600", type="f", mtime="-1") == [f"{base}/a/b/notes.txt", f"{base}/a/y.H5", f"{base}/x.h5"]
    assert paths(xattr="user.tag", xattr_value=b"hot") == [f"{base}/a/y.H5"]
    assert paths(xattr="user.tag", xattr_value="cold") == []
    assert paths(mindepth=2, maxdepth=2) == [f"{base}/a/b", f"{base}/a/y.H5"]
    assert paths(name="*.nothing") == []
    path, st = fs.find(base, name="y.H5")[0]
    assert path == f"{base}/a/y.H5" and st.st_size == 3000 and st.is_file()

    with pytest.raises(ValueError, match="size"):
        fs.find(base, size="big")
    with pytest.raises(ValueError, match="pattern"):
        fs.find(base, name="[x")
    with pytest.raises(TypeError, match="unexpected keyword"):
        fs.find(base, colour="blue")
    with pytest.raises(FileNotFoundError):
        fs.find(f"{base}/missing")


def test_async_find(cluster, fs, base):
    fs.makedirs(f"{base}/d")
    fs.write_bytes(f"{base}/d/f.h5", b"1")

    async def main():
        c = shoal.AsyncClient(cluster)
        return await c.find(base, name="*.h5")

    assert [p for p, _ in asyncio.run(main())] == [f"{base}/d/f.h5"]

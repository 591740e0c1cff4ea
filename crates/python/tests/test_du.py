"""Client.du and AsyncClient.du (docs/du.md): what a tree holds, added up from the usage
every server keeps per directory, against real servers."""

import asyncio

import pytest

import shoal


def build(fs, base):
    """base: a/ (f1 100 B, f2 250 B, hard = f1 again, b/ (f3 4000 B), e/ (empty)),
    c/ (ln -> "../a/f1", 7 B), top (1 B)."""
    for d in ("a/b", "a/e", "c"):
        fs.makedirs(f"{base}/{d}")
    fs.write_bytes(f"{base}/a/f1", b"1" * 100)
    fs.write_bytes(f"{base}/a/f2", b"2" * 250)
    fs.write_bytes(f"{base}/a/b/f3", b"3" * 4000)
    fs.write_bytes(f"{base}/top", b"t")
    fs.link(f"{base}/a/f1", f"{base}/a/hard")
    fs.symlink("../a/f1", f"{base}/c/ln")


def rows(report):
    return [(d["path"], d["depth"], d["files"], d["dirs"], d["bytes"]) for d in report["dirs"]]


def test_du_adds_up_a_known_tree(fs, base):
    build(fs, base)

    # Totals: 5 files (the hard link counted once, the symbolic link as a file of its
    # target's length), 4 directories below base, 100 + 250 + 4000 + 7 + 1 bytes.
    r = fs.du(base)
    assert set(r) == {"dirs", "unreadable"} and r["unreadable"] == []
    assert len(r["dirs"]) == 1
    top = r["dirs"][0]
    assert top == {"path": base, "ino": fs.stat(base).st_ino, "depth": 0, "files": 5, "dirs": 4, "bytes": 4358,
                   "inodes": 10}

    # Directories down to a depth: each before its parent, siblings by name, base last.
    assert rows(fs.du(base, depth=1)) == [(f"{base}/a", 1, 3, 2, 4350), (f"{base}/c", 1, 1, 0, 7),
                                         (base, 0, 5, 4, 4358)]
    r = fs.du(base + "/", 5)
    assert rows(r) == [(f"{base}/a/b", 2, 1, 0, 4000), (f"{base}/a/e", 2, 0, 0, 0), (f"{base}/a", 1, 3, 2, 4350),
                       (f"{base}/c", 1, 1, 0, 7), (base, 0, 5, 4, 4358)]
    for d in r["dirs"]:
        assert d["ino"] == fs.stat(d["path"]).st_ino
        assert d["inodes"] == d["files"] + d["dirs"] + 1

    # A file, and a symbolic link (not followed), report themselves.
    assert rows(fs.du(f"{base}/a/f2", 3)) == [(f"{base}/a/f2", 0, 1, 0, 250)]
    assert rows(fs.du(f"{base}/c/ln")) == [(f"{base}/c/ln", 0, 1, 0, 7)]

    # The usage follows changes: a file written, one removed, a directory moved.
    fs.write_bytes(f"{base}/c/new", b"n" * 50)
    fs.unlink(f"{base}/a/f2")
    fs.rename(f"{base}/a/b", f"{base}/c/b")
    assert rows(fs.du(base, 1)) == [(f"{base}/a", 1, 1, 1, 100), (f"{base}/c", 1, 3, 1, 4057),
                                   (base, 0, 5, 4, 4158)]

    with pytest.raises(FileNotFoundError, match="missing"):
        fs.du(f"{base}/missing")
    with pytest.raises(FileNotFoundError):
        fs.du(f"{base}/nothing/below")
    with pytest.raises(OverflowError):
        fs.du(base, -1)


def test_async_du(cluster, fs, base):
    fs.makedirs(f"{base}/d/e")
    fs.write_bytes(f"{base}/d/f.h5", b"1" * 10)
    fs.write_bytes(f"{base}/d/e/g.h5", b"2" * 20)

    async def main():
        c = shoal.AsyncClient(cluster)
        report = await c.du(base, 2)
        with pytest.raises(FileNotFoundError):
            await c.du(f"{base}/missing")
        return report

    r = asyncio.run(main())
    assert r["unreadable"] == []
    assert rows(r) == [(f"{base}/d/e", 2, 1, 0, 20), (f"{base}/d", 1, 2, 1, 30), (base, 0, 2, 2, 30)]

"""The change log from Python (docs/changes.md): a watch under a directory as a stream of
event dicts, blocking and with `async for`, patterns, and a consumer that restarts with
nothing missed or repeated, against real servers."""

import asyncio

import pytest

import shoal


def write(fs, path, data=b"x"):
    with fs.open(path, "wb") as f:
        f.write(data)


def test_a_watch_streams_events_with_paths(fs, base):
    w = fs.watch(base, events="create,close,rename,unlink", pattern="*.h5")
    write(fs, f"{base}/a.h5")
    write(fs, f"{base}/skip.txt")
    fs.rename(f"{base}/a.h5", f"{base}/b.h5")
    fs.unlink(f"{base}/b.h5")
    got = [w.next(timeout=10) for _ in range(4)]
    assert [(e["event"], e["path"]) for e in got] == [
        ("create", f"{base}/a.h5"), ("close", f"{base}/a.h5"), ("rename", f"{base}/a.h5"), ("unlink", f"{base}/b.h5")]
    assert got[2]["to_path"] == f"{base}/b.h5"
    assert got[0]["type"] == "f" and got[0]["ino"] > 0 and got[0]["seq"] > 0 and got[0]["at"] > 0
    assert w.next(timeout=0.3) is None and w.lost == 0
    with pytest.raises(ValueError, match="bogus"):
        fs.watch(base, events="bogus")
    with pytest.raises(FileNotFoundError):
        fs.watch(f"{base}/nope")


def test_a_consumer_restarts_without_missing_or_repeating(fs, base):
    name = "py-" + base.strip("/").replace("_", "-")[-40:]
    w = fs.watch(base, events="create", consumer=name)
    for i in range(6):
        write(fs, f"{base}/f{i}")
    first = [w.next(timeout=10)["path"] for _ in range(3)]
    w.ack()
    del w
    for i in range(6, 8):
        write(fs, f"{base}/f{i}")
    w = fs.watch(base, events="create", consumer=name)
    rest = [w.next(timeout=10)["path"] for _ in range(5)]
    assert w.next(timeout=0.3) is None
    assert sorted(first + rest) == sorted(f"{base}/f{i}" for i in range(8))
    fs.forget_consumer(name)


def test_async_for_over_a_watch(cluster, base):
    async def main():
        fs = shoal.AsyncClient(cluster)
        w = await fs.watch(base, events="mkdir")
        await fs.mkdir(f"{base}/d1")
        await fs.mkdir(f"{base}/d1/d2")
        seen = []
        async for e in w:
            seen.append(e["path"])
            if len(seen) == 2:
                break
        assert sorted(seen) == [f"{base}/d1", f"{base}/d1/d2"]
        assert await w.next_async(timeout=0.2) is None

    asyncio.run(main())

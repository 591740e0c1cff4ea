"""The tuple space from Python (docs/tuples.md): tuples of int, str and bytes, templates with
None and types as wildcards, reads, takes with a timeout, and watches resumed from a
cursor, against real servers."""

import asyncio
import threading
import time

import pytest

import shoal


def test_write_read_take_by_template(fs, base):
    k = f"tuples:{base}"
    assert fs.tuple_write([k, 1, "one", b"\x00\x01"]) > 0
    fs.tuple_write([k, 2, "two", b""])
    assert fs.tuple_read([k, None, None, None]) == (k, 1, "one", b"\x00\x01")
    assert fs.tuple_read([k, int, str, bytes]) == (k, 1, "one", b"\x00\x01")
    assert fs.tuple_read([k, 2, None, None]) == (k, 2, "two", b"")
    assert fs.tuple_read([k, "2", None, None]) is None  # "2" is not 2
    assert fs.tuple_read([k, None]) is None  # arity
    assert fs.tuple_take([k, int, None, None]) == (k, 1, "one", b"\x00\x01")
    assert fs.tuple_take([k, int, None, None]) == (k, 2, "two", b"")
    assert fs.tuple_take([k, int, None, None]) is None

    with pytest.raises(ValueError, match="first field"):
        fs.tuple_read([None, 1])
    with pytest.raises(ValueError, match="int"):
        fs.tuple_write([k, 1.5])
    with pytest.raises(ValueError, match="int"):
        fs.tuple_read([k, float])


def test_a_blocking_take_waits_and_times_out(fs, base):
    k = f"queue:{base}"
    t0 = time.monotonic()
    assert fs.tuple_take([k, None], timeout=0.3) is None
    assert time.monotonic() - t0 >= 0.3

    got = []
    taker = threading.Thread(target=lambda: got.append(fs.tuple_take([k, None], timeout=None)))
    taker.start()
    time.sleep(0.2)
    fs.tuple_write([k, "job"])
    taker.join(10)
    assert got == [(k, "job")]


def test_watch_resumes_from_its_cursor(fs, base):
    k = f"watch:{base}"
    w = fs.tuple_watch([k, int], taken=True)
    fs.tuple_write([k, 1])
    fs.tuple_write([k, "skipped"])
    fs.tuple_take([k, 1])
    seq, kind, tup, uid, at = w.next(timeout=10)
    assert (kind, tup) == ("written", (k, 1)) and at > 0
    assert w.next(timeout=10)[1:3] == ("taken", (k, 1))
    assert w.next(timeout=0.2) is None
    cursor = w.cursor
    fs.tuple_write([k, 2])
    w2 = fs.tuple_watch([k, int], after=cursor)
    assert w2.next(timeout=10)[1:3] == ("written", (k, 2))
    assert w2.next(timeout=0.2) is None and w2.lost == 0


def test_async_client_calls(cluster, base):
    async def main():
        fs = shoal.AsyncClient(cluster)
        k = f"async:{base}"
        w = await fs.tuple_watch([k, None])
        await fs.tuple_write([k, b"x"])
        assert await fs.tuple_read([k, bytes]) == (k, b"x")
        event = await w.next_async(timeout=10)
        assert event[2] == (k, b"x")
        assert await fs.tuple_take([k, None], timeout=1.0) == (k, b"x")

    asyncio.run(main())


def test_files_metadata_through_templates(fs, base):
    with fs.open(f"{base}/a.dat", "wb") as f:
        f.write(b"abc")
    fs.makedirs(f"{base}/sub")
    with fs.open(f"{base}/sub/b.dat", "wb") as f:
        f.write(b"hello")
    three = fs.file_tuples(base, ["file", None, "f", 3, None, None, None, None])
    assert [t[1] for t in three] == [f"{base}/a.dat"]
    files = fs.file_tuples(base, ["file", None, "f", int, 0, 0, None, int])
    assert [t[1] for t in files] == [f"{base}/a.dat", f"{base}/sub/b.dat"]
    assert files[1][3] == 5
    assert fs.file_tuples(base, ["file", f"{base}/sub", "d", None, None, None, None, None])[0][2] == "d"
    with pytest.raises(OSError) as e:
        fs.file_tuples(base, ["file", None])
    assert e.value.errno == 22 and "shape" in str(e.value)

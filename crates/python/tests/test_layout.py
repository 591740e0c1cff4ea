"""Layouts from Python: files created with one report it, directory defaults are kept and
inherited, a file's layout is fixed, bad values are refused; the asyncio twins agree.

The session's cluster has 3 servers with stripes of 64 KiB over all of them (conftest.py)."""

import asyncio
import errno

import pytest

import shoal

SERVERS = 3


def check_servers(layout, count):
    assert layout.servers is not None and len(layout.servers) == count == layout.stripe_count
    assert len(set(layout.servers)) == count and all(0 <= s < SERVERS for s in layout.servers)
    assert layout.first_server == layout.servers[0] and layout.policy is None


def test_files_created_with_a_layout_report_it(fs, base):
    data = bytes(range(256)) * 2048  # 512 KiB: four stripes of 128 KiB
    with fs.open(f"{base}/two", "wb", layout=shoal.Layout(stripe_count=2, stripe_size=128 << 10)) as f:
        f.write(data)
    layout = fs.layout(f"{base}/two")
    assert isinstance(layout, shoal.Layout)
    assert layout.stripe_size == 128 << 10
    check_servers(layout, 2)
    assert fs.read_bytes(f"{base}/two") == data

    fs.write_bytes(f"{base}/plain", b"x")
    plain = fs.layout(f"{base}/plain")  # the cluster's defaults
    assert plain.stripe_size == 64 << 10
    check_servers(plain, SERVERS)

    with fs.open_file(f"{base}/native", "x", layout=shoal.Layout(stripe_count=1)) as f:
        f.pwrite(b"abc", 0)
    check_servers(fs.layout(f"{base}/native"), 1)
    assert "stripe_count=1" in repr(fs.layout(f"{base}/native"))


def test_first_server_and_every_server(fs, base):
    for s in range(SERVERS):  # server 0 is a server like the others
        fs.write_bytes(f"{base}/pinned{s}", b"x", layout=shoal.Layout(stripe_count=1, first_server=s))
        assert fs.layout(f"{base}/pinned{s}").servers == [s]
    fs.write_bytes(f"{base}/all", b"x", layout=shoal.Layout(stripe_count=-1, stripe_size=4096))
    all_ = fs.layout(f"{base}/all")
    assert all_.stripe_size == 4096
    check_servers(all_, SERVERS)


def test_a_files_layout_can_be_copied_to_a_new_file(fs, base):
    fs.write_bytes(f"{base}/a", b"a", layout=shoal.Layout(stripe_count=2, first_server=1, stripe_size=256 << 10))
    a = fs.layout(f"{base}/a")
    assert a.servers[0] == 1
    fs.write_bytes(f"{base}/b", b"b", layout=a)  # its servers are not asked for: first and count say them
    assert fs.layout(f"{base}/b") == a


def test_directory_defaults_are_kept_and_inherited(fs, base):
    d = f"{base}/d"
    fs.mkdir(d)
    unset = fs.layout(d)
    assert unset == shoal.Layout() and unset.servers is None
    assert (unset.stripe_size, unset.stripe_count, unset.first_server, unset.policy) == (None, None, None, None)

    fs.set_layout(d, stripe_count=1, stripe_size=1 << 20, policy="spread")
    got = fs.layout(d)
    assert (got.stripe_size, got.stripe_count, got.first_server, got.policy, got.servers) == (
        1 << 20, 1, None, "spread", None)
    with fs.open(f"{d}/f", "w") as f:
        f.write("inherits")
    f_layout = fs.layout(f"{d}/f")
    assert f_layout.stripe_size == 1 << 20
    check_servers(f_layout, 1)
    # Asked-for fields win, the others still come from the directory.
    fs.write_bytes(f"{d}/g", b"g", layout=shoal.Layout(stripe_count=2))
    g = fs.layout(f"{d}/g")
    assert g.stripe_size == 1 << 20
    check_servers(g, 2)
    fs.mkdir(f"{d}/sub")
    assert fs.layout(f"{d}/sub") == got

    fs.set_layout(d, stripe_count=-1)
    assert fs.layout(d).stripe_count == -1 and fs.layout(d).stripe_size is None
    fs.set_layout(d)  # nothing asked: back to the cluster's defaults
    assert fs.layout(d) == shoal.Layout()


def test_a_files_layout_is_fixed_when_it_is_created(fs, base):
    fs.write_bytes(f"{base}/f", b"data", layout=shoal.Layout(stripe_count=2))
    with pytest.raises(FileExistsError):
        fs.set_layout(f"{base}/f", stripe_count=1)
    # An existing file keeps its own layout when opened with another.
    with fs.open(f"{base}/f", "w", layout=shoal.Layout(stripe_count=1)) as f:
        f.write("new")
    check_servers(fs.layout(f"{base}/f"), 2)
    fs.write_bytes(f"{base}/f", b"again", layout=shoal.Layout(stripe_count=3))
    check_servers(fs.layout(f"{base}/f"), 2)
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/f", "x", layout=shoal.Layout(stripe_count=1))
    for mode in ("r", "r+", "rb"):
        with pytest.raises(ValueError):
            fs.open(f"{base}/f", mode, layout=shoal.Layout(stripe_count=1))


def test_bad_layouts_are_refused(fs, base):
    for bad in (dict(policy="fast"), dict(stripe_count=0), dict(stripe_count=-2), dict(stripe_size=0),
                dict(stripe_size=-4096), dict(first_server=-1)):
        with pytest.raises(ValueError):
            shoal.Layout(**bad)
        with pytest.raises(ValueError):
            fs.set_layout(base, **bad)
    with pytest.raises(TypeError):
        shoal.Layout(65536)  # keywords only
    with pytest.raises(TypeError):
        fs.open(f"{base}/x", "w", layout={"stripe_count": 1})
    # What only the cluster can judge: OSError EINVAL, with the servers' reason.
    for bad in (dict(stripe_size=1000), dict(stripe_count=SERVERS + 1), dict(first_server=99)):
        with pytest.raises(OSError) as e:
            fs.set_layout(base, **bad)
        assert e.value.errno == errno.EINVAL and str(e.value)
    with pytest.raises(OSError) as e:
        fs.write_bytes(f"{base}/x", b"x", layout=shoal.Layout(stripe_size=1000))
    assert e.value.errno == errno.EINVAL and not fs.exists(f"{base}/x")
    with pytest.raises(FileNotFoundError):
        fs.layout(f"{base}/missing")
    assert fs.layout(base) == shoal.Layout()  # unchanged by the failures


def test_replica_counts_round_trip(fs, base):
    """docs/replicas.md: the session's cluster keeps one copy (`[cluster] replicas` unset),
    so files get 1 whatever they ask; a directory keeps the count it was given."""
    fs.write_bytes(f"{base}/plain", b"x")
    assert fs.layout(f"{base}/plain").replicas == 1
    d = f"{base}/d"
    fs.mkdir(d)
    assert fs.layout(d).replicas is None
    fs.set_layout(d, replicas=3, stripe_count=1)
    got = fs.layout(d)
    assert got.replicas == 3 and got.stripe_count == 1 and "replicas=3" in repr(got)
    fs.mkdir(f"{d}/sub")
    assert fs.layout(f"{d}/sub").replicas == 3  # mkdir copies the default
    fs.write_bytes(f"{d}/f", b"f")
    assert fs.layout(f"{d}/f").replicas == 1  # capped to the cluster's count
    fs.write_bytes(f"{base}/two", b"2", layout=shoal.Layout(replicas=2))
    assert fs.layout(f"{base}/two").replicas == 1
    assert shoal.Layout(replicas=2).replicas == 2
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match=f"replicas {bad} must be 1 to 3"):
            shoal.Layout(replicas=bad)
        with pytest.raises(ValueError):
            fs.set_layout(d, replicas=bad)
    assert fs.layout(d).replicas == 3  # unchanged by the failures


def test_asyncio_twins_give_the_same_answers(cluster, fs, base):
    async def main():
        afs = shoal.AsyncClient(cluster)
        await afs.mkdir(f"{base}/d")
        await afs.set_layout(f"{base}/d", stripe_count=2, first_server=2)
        assert await afs.layout(f"{base}/d") == fs.layout(f"{base}/d")
        assert fs.layout(f"{base}/d").first_server == 2
        async with await afs.open(f"{base}/d/f", "w") as f:
            await f.pwrite(b"x" * 100_000, 0)
        assert fs.layout(f"{base}/d/f").servers[0] == 2
        async with await afs.open(f"{base}/d/g", "x", layout=shoal.Layout(stripe_count=3)) as f:
            await f.pwrite(b"y", 0)
        assert fs.layout(f"{base}/d/g").stripe_count == 3
        await afs.write_bytes(f"{base}/d/h", b"z", layout=shoal.Layout(stripe_count=1))
        layouts = await asyncio.gather(*(afs.layout(f"{base}/d/{n}") for n in "fgh"))
        assert layouts == [fs.layout(f"{base}/d/{n}") for n in "fgh"]
        assert [len(l.servers) for l in layouts] == [2, 3, 1]
        with pytest.raises(FileExistsError):
            await afs.set_layout(f"{base}/d/f", stripe_count=1)
        with pytest.raises(OSError) as e:
            await afs.set_layout(f"{base}/d", stripe_size=1000)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(ValueError):
            await afs.open(f"{base}/d/f", "r", layout=shoal.Layout(stripe_count=1))

    asyncio.run(main())


def test_read_mostly_marks_are_set_inherited_and_cleared(cluster, fs, base):
    d = f"{base}/libs"
    fs.mkdir(d)
    assert not fs.stat(d).read_mostly
    fs.set_read_mostly(d)
    assert fs.stat(d).read_mostly
    fs.write_bytes(f"{d}/libx.so", b"elf")
    fs.mkdir(f"{d}/sub")
    assert fs.stat(f"{d}/libx.so").read_mostly and fs.stat(f"{d}/sub").read_mostly
    fs.set_read_mostly(f"{d}/libx.so", on=False)
    assert not fs.stat(f"{d}/libx.so").read_mostly
    with pytest.raises(FileNotFoundError):
        fs.set_read_mostly(f"{d}/missing")

    async def main():
        afs = shoal.AsyncClient(cluster)
        await afs.set_read_mostly(d, on=False)
        assert not (await afs.stat(d)).read_mostly

    asyncio.run(main())

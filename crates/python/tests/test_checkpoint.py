"""Micro-checkpointing from Python (docs/checkpoint.md): parts saved by tasks in any order
and without a barrier, committed when the last arrives; a part never saved leaves its
checkpoint uncommitted and a restart uses the one before; blocking and asyncio forms,
against real servers."""

import asyncio
import random
import threading
import time

import pytest

import shoal

PARTS = 4


def test_a_checkpoint_is_committed_when_its_last_part_arrives(fs, base):
    ck = fs.micro_checkpoint(f"sim{base}", f"{base}/ckpt", PARTS)
    assert isinstance(ck, shoal.MicroCheckpoint)
    assert (ck.name, ck.dir, ck.parts) == (f"sim{base}", f"{base}/ckpt", PARTS)
    assert ck.latest() is None
    for n in range(2):
        for part in [2, 0, 3, 1]:
            assert not ck.is_committed(n), f"{n} committed before part {part}"
            ck.save(n, part, f"step {n} part {part}".encode())
        assert ck.is_committed(n)
        assert ck.latest() == n
    assert ck.load(1, 3) == b"step 1 part 3"
    # Parts are files, named by the checkpoint and the part.
    assert ck.part_path(1, 3) == f"{base}/ckpt/1.3"
    assert fs.read_bytes(ck.part_path(0, 2)) == b"step 0 part 2"
    # Any bytes-like object is saved; saving a part again replaces it and counts once.
    ck.save(2, 0, bytearray(b"first"))
    ck.save(2, 0, memoryview(b"again"))
    assert ck.load(2, 0) == b"again"


def test_a_part_never_saved_leaves_n_uncommitted_and_latest_gives_n_minus_1(fs, cluster, base):
    name, where = f"job{base}", f"{base}/ckpt"
    ck = fs.micro_checkpoint(name, where, PARTS)
    for n in range(3):
        for part in range(PARTS):
            if n == 2 and part == PARTS - 1:
                continue  # this task is killed before it saves its part of 2
            ck.save(n, part, bytes([n, part]) * 100)
    # The other tasks go on to 3 without waiting.
    for part in range(PARTS - 1):
        ck.save(3, part, b"later")
    t0 = time.monotonic()
    assert ck.is_committed(2, timeout=0.3) is False
    assert time.monotonic() - t0 >= 0.3
    assert ck.is_committed(3) is False
    assert ck.latest() == 1

    # A restart (a new client and handle, by the constructor) starts from 1, whose parts
    # are all there, and finds no part 3 of checkpoint 2.
    again = shoal.MicroCheckpoint(shoal.Client(cluster), name, where, PARTS)
    assert again.latest() == 1
    assert [again.load(1, p) for p in range(PARTS)] == [bytes([1, p]) * 100 for p in range(PARTS)]
    with pytest.raises(FileNotFoundError):
        again.load(2, PARTS - 1)
    # The task comes back and saves its part: 2 is committed, and is the latest.
    again.save(2, PARTS - 1, b"late")
    assert again.is_committed(2) and ck.is_committed(2)
    assert again.latest() == 2


def test_tasks_on_threads_save_at_their_own_pace_without_a_barrier(fs, base):
    ck = fs.micro_checkpoint(f"threads{base}", f"{base}/ckpt", PARTS)
    steps = 5
    done_at = {}

    def task(rank):
        rng = random.Random(rank)
        for n in range(steps):
            time.sleep(rng.uniform(0, 0.02) * (rank + 1))  # uneven speeds
            ck.save(n, rank, f"{n}:{rank}".encode())
        done_at[rank] = time.monotonic()

    threads = [threading.Thread(target=task, args=(r,)) for r in range(PARTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done_at) == PARTS
    # The fastest task finished before the slowest: nobody waited for the others.
    assert min(done_at.values()) < max(done_at.values())
    assert all(ck.is_committed(n, timeout=10) for n in range(steps))
    assert ck.latest() == steps - 1
    assert ck.load(steps - 1, PARTS - 1) == f"{steps - 1}:{PARTS - 1}".encode()


def test_bad_arguments(fs, base):
    with pytest.raises(ValueError, match="at least one part"):
        fs.micro_checkpoint("x", f"{base}/ckpt", 0)
    with pytest.raises(ValueError, match="name"):
        shoal.MicroCheckpoint(fs, "", f"{base}/ckpt", 2)
    with pytest.raises(TypeError, match="Client"):
        shoal.MicroCheckpoint("not a client", "x", f"{base}/ckpt", 2)
    ck = fs.micro_checkpoint(f"bad{base}", f"{base}/ckpt", 2)
    with pytest.raises(ValueError, match="part 2 of a checkpoint of 2 parts"):
        ck.save(0, 2, b"x")
    with pytest.raises(FileNotFoundError):
        ck.load(0, 0)
    with pytest.raises(OverflowError):
        ck.save(-1, 0, b"x")
    # A file where the directory should be.
    fs.write_bytes(f"{base}/file", b"")
    with pytest.raises(OSError):
        fs.micro_checkpoint("f", f"{base}/file/ckpt", 2)


def test_async_client_checkpoints(cluster, base):
    async def main():
        fs = shoal.AsyncClient(cluster)
        ck = await fs.micro_checkpoint(f"async{base}", f"{base}/ckpt", 3)
        assert isinstance(ck, shoal.AsyncMicroCheckpoint)
        assert await ck.latest() is None
        # Every part of 0 in flight at once.
        await asyncio.gather(*(ck.save(0, p, bytes([p]) * 10) for p in range(3)))
        assert await ck.is_committed(0) is True
        await ck.save(1, 0, b"only one")
        assert await ck.is_committed(1, timeout=0.1) is False
        assert await ck.latest() == 0
        assert await ck.load(0, 2) == bytes([2]) * 10
        # The blocking handle of the same job sees the same checkpoints.
        blocking = shoal.MicroCheckpoint(fs, f"async{base}", f"{base}/ckpt", 3)
        assert blocking.latest() == 0

    asyncio.run(main())


"""The asyncio client: awaitables driven by the client's runtime."""

import asyncio

import pytest

import shoal


def run(coro):
    return asyncio.run(coro)


def test_many_calls_in_flight_at_once(cluster, base):
    async def main():
        fs = shoal.AsyncClient(cluster)
        payloads = {i: bytes([i]) * (70_000 + i) for i in range(64)}
        await asyncio.gather(*(fs.write_bytes(f"{base}/f{i}", p) for i, p in payloads.items()))
        names = await fs.listdir(base)
        assert len(names) == 64
        got = await asyncio.gather(*(fs.read_bytes(f"{base}/f{i}") for i in payloads))
        assert got == list(payloads.values())
        stats = await asyncio.gather(*(fs.stat(f"{base}/f{i}") for i in payloads))
        assert [s.st_size for s in stats] == [len(p) for p in payloads.values()]

    run(main())


def test_async_files_and_errors(cluster, base):
    async def main():
        fs = shoal.AsyncClient(cluster)
        async with await fs.open(f"{base}/f", "w+") as f:
            assert isinstance(f, shoal.AsyncFile)
            writes = [f.pwrite(bytes([65 + i]) * 65536, i * 65536) for i in range(16)]
            assert await asyncio.gather(*writes) == [65536] * 16
            await f.fsync()
            assert (await f.fstat()).st_size == 16 * 65536
            assert await f.pread(3, 65536 * 2) == b"CCC"
            buf = bytearray(65536)
            assert await f.preadinto(buf, 65536 * 15) == 65536
            assert buf == b"P" * 65536
        assert f.closed
        with pytest.raises(ValueError):
            await f.pread(1, 0)
        with pytest.raises(FileNotFoundError):
            await fs.stat(f"{base}/missing")
        # Awaitables complete on the loop that awaited them, while it runs other tasks.
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        await fs.write_bytes(f"{base}/big", b"x" * (8 << 20))
        t.cancel()
        assert ticks > 0

    run(main())

"""shoal:// through fsspec, as pandas, pyarrow and Dask use it."""

import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def url(cluster, base, monkeypatch):
    monkeypatch.setenv("SHOAL_CONFIG", cluster)
    fsspec.config.conf.pop("shoal", None)
    return f"shoal://{base}"


def test_the_protocol_is_registered():
    assert "shoal" in fsspec.available_protocols()
    cls = fsspec.get_filesystem_class("shoal")
    assert cls.__module__ == "shoal.filesystem"


def test_pandas_reads_and_writes_parquet_and_csv(url):
    df = pd.DataFrame({"step": np.arange(100_000), "energy": np.random.default_rng(1).random(100_000),
                       "tag": ["a", "b", "c", "d"] * 25_000})
    df.to_parquet(f"{url}/t.parquet")
    back = pd.read_parquet(f"{url}/t.parquet")
    pd.testing.assert_frame_equal(back, df)
    cols = pd.read_parquet(f"{url}/t.parquet", columns=["energy"])
    assert list(cols.columns) == ["energy"]
    df.head(1000).to_csv(f"{url}/t.csv", index=False)
    pd.testing.assert_frame_equal(pd.read_csv(f"{url}/t.csv"), df.head(1000))


def test_pyarrow_datasets_over_a_directory(url):
    fs = fsspec.filesystem("shoal")
    for i in range(3):
        pd.DataFrame({"part": [i] * 10, "x": range(10)}).to_parquet(f"{url}/ds/part-{i}.parquet")
    table = pq.read_table(f"{url.removeprefix('shoal://')}/ds", filesystem=fs)
    assert table.num_rows == 30


def test_file_system_calls(url, cluster):
    fs = fsspec.filesystem("shoal", config=cluster)
    base = url.removeprefix("shoal://")
    fs.pipe(f"{base}/a/b.txt", b"0123456789")
    assert fs.cat(f"{url}/a/b.txt") == b"0123456789"
    assert fs.cat_file(f"{base}/a/b.txt", start=2, end=5) == b"234"
    assert fs.info(f"{base}/a/b.txt")["size"] == 10 and fs.isfile(f"{base}/a/b.txt")
    assert fs.isdir(f"{base}/a")
    assert fs.ls(f"{base}/a", detail=False) == [f"{base}/a/b.txt"]
    fs.cp_file(f"{base}/a/b.txt", f"{base}/a/c.txt")
    fs.mv(f"{base}/a/c.txt", f"{base}/d.txt")
    assert sorted(fs.find(base)) == [f"{base}/a/b.txt", f"{base}/d.txt"]
    assert fs.glob(f"{base}/*.txt") == [f"{base}/d.txt"]
    with fs.open(f"{base}/w.bin", "wb") as f:
        f.write(b"x" * 1000)
    assert fs.size(f"{base}/w.bin") == 1000
    fs.rm(f"{base}/a", recursive=True)
    assert not fs.exists(f"{base}/a")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{base}/missing")
    with fsspec.open(f"{url}/t.txt", "w") as f:
        f.write("text via fsspec.open\n")
    with fsspec.open(f"{url}/t.txt", "r") as f:
        assert f.read() == "text via fsspec.open\n"


def test_rm_recursive_expands_globs(url, cluster):
    fs = fsspec.filesystem("shoal", config=cluster)
    base = url.removeprefix("shoal://")
    for name in ("keep.txt", "a.parquet/part.0.parquet", "a.parquet/part.1.parquet", "b.parquet/part.0.parquet",
                 "c.parquet"):
        fs.pipe(f"{base}/out/{name}", b"x")
    # As fsspec's own rm: the pattern names trees (directories) and files alike.
    fs.rm(f"{url}/out/*.parquet", recursive=True)
    assert fs.ls(f"{base}/out", detail=False) == [f"{base}/out/keep.txt"]
    # A list holding a tree and names inside it: each tree is removed once.
    fs.pipe(f"{base}/t/x/y.txt", b"y")
    fs.rm([f"{base}/t/x/y.txt", f"{base}/t", f"{base}/t/x"], recursive=True)
    assert not fs.exists(f"{base}/t")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{base}/out/*.nothing", recursive=True)
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{base}/missing", recursive=True)
    fs.rm(f"{base}/out/keep.txt")
    assert fs.ls(f"{base}/out") == []


def test_threads_write_into_new_folders_at_once(url, cluster):
    # As Dask's threads and zarr's concurrent chunk writes do: many files, each in a folder
    # that does not exist yet and that other threads make at the same moment.
    from concurrent.futures import ThreadPoolExecutor
    fs = fsspec.filesystem("shoal", config=cluster)
    base = url.removeprefix("shoal://")
    names = [f"{base}/r{r}/c/{i}/{j}" for r in range(15) for i in range(8) for j in range(4)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: fs.pipe_file(name, name.encode()), names))
    assert sorted(fs.find(base)) == sorted(names)
    assert fs.cat(names) == {name: name.encode() for name in names}

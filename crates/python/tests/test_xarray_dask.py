"""shoal:// in Dask (dataframe, bag, array) and xarray (zarr, netCDF): data written through
the libraries comes back equal, from a real cluster. Dask runs on its threaded or
synchronous scheduler (no distributed cluster). scripts/env.sh installs the libraries; a
test is skipped only when one of them cannot be imported."""

import pickle

import fsspec
import numpy as np
import pandas as pd
import pytest


def need(module):
    return pytest.importorskip(module, reason=f"{module} is not installed (scripts/env.sh installs it)")


@pytest.fixture
def url(base):
    return f"shoal://{base}"


@pytest.fixture
def opts(cluster):
    """The storage options naming the test cluster, as a user passes them."""
    return {"config": cluster}


def a_dataset(steps=24):
    xr = need("xarray")
    rng = np.random.default_rng(7)
    return xr.Dataset(
        {"temp": (("time", "x"), rng.random((steps, 300)).astype("float32"), {"units": "K"}),
         "hits": (("time", "x"), rng.integers(0, 1000, (steps, 300))),
         "flag": (("x",), np.arange(300) % 3 == 0)},
        coords={"time": pd.date_range("2024-01-01", periods=steps), "x": np.arange(300) * 0.5},
        attrs={"title": "shoal", "history": "test_xarray_dask"})


# ---- Dask

def test_dask_dataframe_parquet_round_trip(url, base, opts, fs):
    dask = need("dask")
    dd = need("dask.dataframe")
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"i": np.arange(40_000), "energy": rng.random(40_000),
                       "tag": np.array(["a", "b", "c", "d", "e"])[rng.integers(0, 5, 40_000)]})
    ddf = dd.from_pandas(df, npartitions=4)
    # The frame as Dask holds it in memory (strings become its pyarrow string dtype).
    expected = ddf.compute()
    pd.testing.assert_frame_equal(expected, df, check_dtype=False)

    with dask.config.set(scheduler="threads", num_workers=2):
        ddf.to_parquet(f"{url}/t.parquet", storage_options=opts)
        parts = sorted(n for n in fs.listdir(f"{base}/t.parquet") if n.endswith(".parquet"))
        assert parts == [f"part.{i}.parquet" for i in range(4)]

        back = dd.read_parquet(f"{url}/t.parquet", storage_options=opts)
        assert back.npartitions == 4
        pd.testing.assert_frame_equal(back.compute(), expected)

        # Column selection, row filters and divisions from the files' statistics.
        sub = dd.read_parquet(f"{url}/t.parquet", columns=["tag"], filters=[("i", ">=", 30_000)],
                              index="i", calculate_divisions=True, storage_options=opts)
        assert sub.divisions[-1] == 39_999
        pd.testing.assert_frame_equal(sub.compute(), expected[expected.i >= 30_000].set_index("i")[["tag"]])

        # Overwriting replaces the whole folder: no part of the old frame is left behind.
        dd.from_pandas(df.head(1000), npartitions=2).to_parquet(f"{url}/t.parquet", overwrite=True,
                                                                storage_options=opts)
        assert sorted(n for n in fs.listdir(f"{base}/t.parquet") if n.endswith(".parquet")) == \
            ["part.0.parquet", "part.1.parquet"]
        pd.testing.assert_frame_equal(dd.read_parquet(f"{url}/t.parquet", storage_options=opts).compute(),
                                      expected.head(1000))

    # Dask's distributed and process schedulers ship the file system to workers pickled; a
    # worker builds its own (with its own client) from the storage options.
    sfs = fsspec.filesystem("shoal", **opts)
    data = pickle.dumps(sfs)
    type(sfs).clear_instance_cache()
    again = pickle.loads(data)
    assert again is not sfs and again.client is not sfs.client and again.config == opts["config"]
    assert again.ls(f"{base}/t.parquet", detail=False) == sfs.ls(f"{base}/t.parquet", detail=False)


def test_dask_bag_text_files(url, base, opts, fs):
    dask = need("dask")
    db = need("dask.bag")
    lines = [f"line {i}:" + "x" * (i % 50) for i in range(5000)]
    with dask.config.set(scheduler="sync"):
        db.from_sequence(lines, npartitions=4).to_textfiles(f"{url}/plain/*.txt", storage_options=opts)
        db.from_sequence(lines, npartitions=4).to_textfiles(f"{url}/gz/*.txt.gz", compression="gzip",
                                                            storage_options=opts)
        assert len(fs.listdir(f"{base}/plain")) == 4 and len(fs.listdir(f"{base}/gz")) == 4
        assert fs.read_bytes(f"{base}/plain/0.txt").startswith(b"line 0:\nline 1:x\n")

        # Whole files, gzip, and small blocks (byte ranges cut at line ends: seeks and reads).
        for pattern, blocksize in (("plain/*.txt", None), ("gz/*.txt.gz", None), ("plain/*.txt", 4096)):
            bag = db.read_text(f"{url}/{pattern}", blocksize=blocksize, storage_options=opts)
            if blocksize:
                assert bag.npartitions > 20
            assert bag.map(str.rstrip).compute() == lines, pattern


def test_dask_array_to_and_from_zarr(url, opts):
    dask = need("dask")
    da = need("dask.array")
    need("zarr")
    a = da.random.default_rng(11).random((600, 400), chunks=(100, 150))
    with dask.config.set(scheduler="threads", num_workers=2):
        a.to_zarr(f"{url}/a.zarr", storage_options=opts)
        want = a.compute()
        b = da.from_zarr(f"{url}/a.zarr", storage_options=opts)
        assert b.shape == (600, 400) and b.chunks == a.chunks
        np.testing.assert_array_equal(b.compute(), want)
        np.testing.assert_array_equal(b[250:420, 140:160].compute(), want[250:420, 140:160])
        # Rewrite in place: every chunk is replaced.
        (a * 2).to_zarr(f"{url}/a.zarr", overwrite=True, storage_options=opts)
        np.testing.assert_array_equal(da.from_zarr(f"{url}/a.zarr", storage_options=opts).compute(), want * 2)


# ---- xarray

@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_zarr_write_append_overwrite(url, base, opts, fs, zarr_format):
    xr = need("xarray")
    need("zarr")
    need("dask")
    ds = a_dataset()
    store = f"{url}/d.zarr"
    # Consolidated metadata is zarr 2's (zarr 3 warns that its own is not in the specification).
    kw = {"storage_options": opts, "consolidated": zarr_format == 2}
    ds.isel(time=slice(0, 10)).to_zarr(store, mode="w", zarr_format=zarr_format,
                                       encoding={"temp": {"chunks": (5, 100)}}, **kw)
    ds.isel(time=slice(10, None)).to_zarr(store, append_dim="time", **kw)
    back = xr.open_zarr(store, **kw)
    assert back.temp.encoding["chunks"] == (5, 100)
    xr.testing.assert_identical(back.load(), ds)
    meta = "zarr.json" if zarr_format == 3 else ".zarray"
    assert fs.exists(f"{base}/d.zarr/temp/{meta}")

    # mode="w" clears the store first: the old chunks are gone.
    small = ds.isel(time=slice(0, 3), x=slice(0, 50))
    small.to_zarr(store, mode="w", zarr_format=zarr_format, **kw)
    xr.testing.assert_identical(xr.open_zarr(store, **kw).load(), small)
    chunks = [p for p in fsspec.filesystem("shoal", **opts).find(f"{base}/d.zarr/temp")
              if p.rsplit("/", 1)[1] not in (".zarray", ".zattrs", "zarr.json")]
    assert len(chunks) == 1, chunks


def test_xarray_dask_chunks_written_in_parallel(url, opts):
    xr = need("xarray")
    need("zarr")
    dask = need("dask")
    ds = a_dataset(40)
    with dask.config.set(scheduler="threads", num_workers=4):
        ds.chunk({"time": 5, "x": 100}).to_zarr(f"{url}/p.zarr", mode="w", consolidated=False,
                                                 storage_options=opts)
        back = xr.open_zarr(f"{url}/p.zarr", consolidated=False, storage_options=opts)
        assert back.temp.chunks == ((5,) * 8, (100,) * 3)
        xr.testing.assert_identical(back.load(), ds)
        # A lazy computation over the store, as Dask evaluates it.
        np.testing.assert_allclose(back.temp.mean("time").values, ds.temp.mean("time").values, rtol=1e-6)


@pytest.mark.parametrize("engine", ["scipy", "h5netcdf"])
def test_xarray_netcdf_through_file_objects(url, opts, engine):
    xr = need("xarray")
    need("h5netcdf" if engine == "h5netcdf" else "scipy")
    if engine == "h5netcdf":
        need("h5py")
    ds = a_dataset()
    sfs = fsspec.filesystem("shoal", **opts)
    path = f"{url.removeprefix('shoal://')}/d-{engine}.nc"
    with sfs.open(path, "wb") as f:
        ds.to_netcdf(f, engine=engine)
    assert sfs.size(path) > ds.temp.nbytes
    with sfs.open(path, "rb") as f, xr.open_dataset(f, engine=engine) as back:
        xr.testing.assert_identical(back.load(), ds)
    with fsspec.open(f"{url}/d-{engine}.nc", "rb", **opts) as f, xr.open_dataset(f, engine=engine) as back:
        np.testing.assert_array_equal(back["hits"].isel(time=5).values, ds["hits"].isel(time=5).values)

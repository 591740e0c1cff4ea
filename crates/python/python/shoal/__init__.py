"""Shoal's native client for Python.

    import shoal
    fs = shoal.Client("cluster.toml")          # or $SHOAL_CONFIG
    with fs.open("/data/run1.csv", "w") as f:  # file objects like Python's own
        f.write("step,energy\\n")
    fs.listdir("/data")

``shoal.AsyncClient`` has the same calls as awaitables; ``shoal://`` paths work in pandas,
pyarrow, xarray and Dask through fsspec (``shoal.filesystem``). See docs/python.md.
"""

from ._native import AsyncFile, AsyncMicroCheckpoint, DirEntry, File, Layout, MicroCheckpoint, Stat, StatFs, TupleWatch, ChangeWatch
from ._native import AsyncClient as _NativeAsyncClient
from ._native import Client as _NativeClient
from .io import RawFile, open_file_object

__all__ = ["Client", "AsyncClient", "AsyncFile", "File", "RawFile", "Stat", "DirEntry", "StatFs", "Layout", "TupleWatch", "ChangeWatch",
           "MicroCheckpoint", "AsyncMicroCheckpoint"]


class Client(_NativeClient):
    """A blocking client of one Shoal cluster (see ``shoal._native.Client`` for the calls
    on paths). Calls release the GIL while they wait."""

    def open(self, path, mode="r", buffering=-1, encoding=None, errors=None, newline=None, perm=0o666, *,
             layout=None):
        """Open ``path`` as Python's built-in ``open`` does: text or binary, buffered or
        not (``buffering=0`` in binary mode gives the raw file), usable in ``with``.
        ``layout`` (a ``shoal.Layout``) applies if the file is created."""
        return open_file_object(self, path, mode, buffering, encoding, errors, newline, perm, layout)


class AsyncClient(_NativeAsyncClient):
    """An asyncio client of one Shoal cluster: every call returns an awaitable."""

    def open(self, path, mode="r", perm=0o666, *, layout=None):
        """An awaitable of the open ``AsyncFile`` (positional ``pread``/``pwrite``/
        ``preadinto``; ``async with`` closes it). ``layout`` (a ``shoal.Layout``) applies if
        the file is created."""
        return self.open_file(path, mode, perm, layout=layout)

"""An fsspec file system for ``shoal://`` paths, so pandas, pyarrow, xarray and Dask read
and write Shoal directly:

    pandas.read_parquet("shoal:///data/table.parquet")
    pandas.read_csv("shoal:///data/t.csv", storage_options={"config": "cluster.toml"})

The cluster is the one of ``storage_options["config"]``, else ``$SHOAL_CONFIG``. A URL
holds a path from the file system's root: ``shoal:///a/b`` and ``shoal://a/b`` both name
``/a/b``. Registered with fsspec under the protocol ``shoal`` (entry point ``fsspec.specs``).
"""

import errno
import os
from glob import has_magic

from fsspec.spec import AbstractFileSystem

from . import Client
from .io import open_file_object


class ShoalFileSystem(AbstractFileSystem):
    """fsspec's file system interface over ``shoal.Client``."""

    protocol = "shoal"
    root_marker = "/"

    def __init__(self, config=None, auto_mkdir=True, **kwargs):
        super().__init__(**kwargs)
        self.config = config if config is not None else os.environ.get("SHOAL_CONFIG")
        self.client = Client(self.config)
        # Writing a file makes its missing parent directories, as object stores behave and
        # as Dask and pandas writers expect of a new output folder.
        self.auto_mkdir = auto_mkdir

    def _make_parent(self, path):
        parent = path.rsplit("/", 1)[0] or "/"
        if self.auto_mkdir and parent != "/":
            self.client.makedirs(parent, exist_ok=True)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("shoal://"):
            path = path[len("shoal://"):]
        path = "/" + path.lstrip("/")
        if len(path) > 1:
            path = path.rstrip("/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def unstrip_protocol(self, name):
        return "shoal://" + self._strip_protocol(name)

    # ---- metadata

    def _info_of(self, path, st):
        kind = {"directory": "directory", "file": "file", "symlink": "other"}[st.kind]
        return {
            "name": path,
            "size": st.st_size if kind == "file" else 0,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info_of(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if not st.is_dir():
            return [self._info_of(path, st)] if detail else [path]
        entries = self.client.scandir(path)
        if not detail:
            return sorted(e.path for e in entries)
        out = []
        for e in entries:
            try:
                out.append(self._info_of(e.path, self.client.stat(e.path)))
            except FileNotFoundError:
                continue  # removed since the listing
        return sorted(out, key=lambda i: i["name"])

    def exists(self, path, **kwargs):
        return self.client.exists(self._strip_protocol(path))

    def created(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def modified(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    # ---- namespace changes

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            self.client.makedirs(path, exist_ok=False)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.client.unlink(self._strip_protocol(path))

    def _rm(self, path):
        path = self._strip_protocol(path)
        if self.client.lstat(path).is_dir():
            self.client.rmdir(path)
        else:
            self.client.unlink(path)

    def rm(self, path, recursive=False, maxdepth=None):
        if not (recursive and maxdepth is None):
            return super().rm(path, recursive=recursive, maxdepth=maxdepth)
        # Whole trees: one rmtree per name, with glob patterns expanded first as fsspec's
        # rm does (``rm("/out/*.parquet", recursive=True)``); a name inside a tree already
        # removed is skipped.
        names = []
        for p in path if isinstance(path, list) else [path]:
            p = self._strip_protocol(p)
            names.extend(self.expand_path(p) if has_magic(p) else [p])
        removed = set()
        for p in sorted(set(names), key=lambda n: n.count("/")):
            parent = p
            while parent not in removed and parent != "/":
                parent = parent.rsplit("/", 1)[0] or "/"
            if parent in removed:
                continue
            self.client.rmtree(p)
            removed.add(p)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        self._make_parent(self._strip_protocol(path2))
        self.client.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.client.exists(path):
            self.client.write_bytes(path, b"")
        else:
            self.client.utime(path)

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        self._make_parent(path2)
        with self.client.open(path1, "rb", buffering=0) as src, self.client.open(path2, "wb", buffering=0) as dst:
            while True:
                chunk = src.read(8 << 20)
                if not chunk:
                    break
                dst.write(chunk)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read_bytes(path)
        with self.client.open(path, "rb", buffering=0) as f:
            size = f.seek(0, os.SEEK_END)
            start = 0 if start is None else (start if start >= 0 else max(size + start, 0))
            end = size if end is None else (end if end >= 0 else max(size + end, 0))
            f.seek(start)
            return f.read(max(end - start, 0))

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if mode == "create" and self.client.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists")
        self._make_parent(path)
        self.client.write_bytes(path, value)

    # ---- files

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if not autocommit:
            raise NotImplementedError("shoal:// writes are committed as they are made (autocommit only)")
        if any(c in mode for c in "wxa"):
            self._make_parent(path)
        buffering = block_size if block_size and block_size > 1 else -1
        return open_file_object(self.client, path, mode, buffering)

"""File objects over Shoal files that behave like Python's own (``io``)."""

import io

_UNSUPPORTED = io.UnsupportedOperation


class RawFile(io.RawIOBase):
    """An unbuffered binary file over a Shoal ``File``: a position, ``readinto`` straight
    into the caller's buffer (numpy arrays included), ``seek``/``tell``/``truncate``.

    ``close`` makes written data durable (the native ``File.close``)."""

    def __init__(self, native, mode):
        super().__init__()
        self._f = native
        self._mode = mode
        self._readable = "r" in mode or "+" in mode
        self._writable = any(c in mode for c in "wxa+")
        self._append = "a" in mode
        self._pos = 0
        self.name = native.path

    @property
    def mode(self):
        return self._mode

    def readable(self):
        return self._readable

    def writable(self):
        return self._writable

    def seekable(self):
        return True

    def fileno(self):
        raise _UNSUPPORTED("a Shoal file has no operating-system descriptor")

    def readinto(self, buffer):
        self._check("read", self._readable)
        mv = memoryview(buffer).cast("B")
        n = self._f.preadinto(mv, self._pos)
        self._pos += n
        return n

    def readall(self):
        self._check("read", self._readable)
        size = self._f.size()
        data = self._f.pread(max(size - self._pos, 0), self._pos) if size > self._pos else b""
        # The file may have grown since the handle learned its size: read on to its end.
        chunks = [data]
        self._pos += len(data)
        while True:
            more = self._f.pread(1 << 20, self._pos)
            if not more:
                break
            chunks.append(more)
            self._pos += len(more)
        return b"".join(chunks)

    def write(self, data):
        self._check("write", self._writable)
        if self._append:
            at = self._f.append(data)
            n = memoryview(data).nbytes
            self._pos = at + n
            return n
        n = self._f.pwrite(data, self._pos)
        self._pos += n
        return n

    def seek(self, offset, whence=io.SEEK_SET):
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._f.size() + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if pos < 0:
            raise OSError(22, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self):
        self._check_open()
        return self._pos

    def truncate(self, size=None):
        self._check("truncate", self._writable)
        size = self._pos if size is None else size
        self._f.truncate(size)
        return size

    def flush(self):
        if not self.closed:
            self._f.flush()

    def fsync(self):
        """Make the data and size durable on the servers."""
        self._check_open()
        self._f.fsync()

    def close(self):
        if not self.closed:
            try:
                super().close()
            finally:
                self._f.close()

    def _check_open(self):
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _check(self, what, allowed):
        self._check_open()
        if not allowed:
            raise _UNSUPPORTED(f"file not open for {what}ing" if what != "truncate" else "file not open for writing")

    def __repr__(self):
        return f"<shoal.RawFile name={self.name!r} mode={self._mode!r}>"


def open_file_object(client, path, mode="r", buffering=-1, encoding=None, errors=None, newline=None, perm=0o666,
                     layout=None):
    """What ``shoal.Client.open`` returns: the layers of Python's ``open`` over a RawFile.
    ``layout`` (a ``shoal.Layout``) applies if the file is created."""
    if not isinstance(mode, str) or len(set(mode)) != len(mode) or set(mode) - set("rwxab+t"):
        raise ValueError(f"invalid mode: {mode!r}")
    binary = "b" in mode
    if binary and "t" in mode:
        raise ValueError("can't have text and binary mode at once")
    if binary and (encoding is not None or errors is not None or newline is not None):
        raise ValueError("binary mode doesn't take an encoding, errors or newline argument")
    if buffering == 0 and not binary:
        raise ValueError("can't have unbuffered text I/O")
    native = client.open_file(path, mode.replace("b", "").replace("t", ""), perm, layout=layout)
    raw = RawFile(native, mode)
    if buffering == 0:
        return raw
    size = buffering if buffering > 1 else 1 << 20
    try:
        if raw.readable() and raw.writable():
            buffered = io.BufferedRandom(raw, size)
        elif raw.writable():
            buffered = io.BufferedWriter(raw, size)
        else:
            buffered = io.BufferedReader(raw, size)
        if binary:
            return buffered
        text = io.TextIOWrapper(buffered, encoding=encoding or "utf-8", errors=errors, newline=newline,
                                line_buffering=buffering == 1)
        text.mode = mode
        return text
    except BaseException:
        raw.close()
        raise

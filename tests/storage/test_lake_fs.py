"""KnownFilesFS: DuckDB's metadata questions about committed files are answered from memory."""

from __future__ import annotations

import datetime as dt

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from storage.fs import KnownFilesFS


class CountingFS(MemoryFileSystem):
    """An in-memory filesystem that counts metadata requests (each one is an HTTP call on S3)."""

    cachable = False
    protocol = ("memory",)

    def __init__(self) -> None:
        super().__init__()
        self.store, self.pseudo_dirs = {}, [""]
        self.asked = 0

    def info(self, path, **kwargs):
        self.asked += 1
        return super().info(path, **kwargs)

    def glob(self, path, **kwargs):
        self.asked += 1
        return super().glob(path, **kwargs)


@pytest.fixture
def inner() -> CountingFS:
    fs = CountingFS()
    fs.pipe_file("/lake/rollouts/a.parquet", b"0123456789")
    fs.pipe_file("/lake/other.txt", b"x")
    fs.asked = 0
    return fs


def test_known_files_need_no_request(inner: CountingFS) -> None:
    # Rule: glob, size, date, existence and open of a listed file ask the store nothing.
    stamp = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
    fs = KnownFilesFS(inner, {"memory:///lake/rollouts/a.parquet": {"name": "/lake/rollouts/a.parquet",
                                                                     "size": 10, "type": "file",
                                                                     "LastModified": stamp}})
    path = "memory:///lake/rollouts/a.parquet"
    assert fs.glob(path) == ["/lake/rollouts/a.parquet"]
    assert (fs.size(path), fs.modified(path), fs.exists(path), fs.isdir(path)) == (10, stamp, True, False)
    with fs.open(path, "rb") as f:
        assert f.read() == b"0123456789"
    assert inner.asked == 0


def test_unknown_paths_go_to_the_store(inner: CountingFS) -> None:
    # Rule: anything not listed at refresh is answered by the wrapped filesystem.
    fs = KnownFilesFS(inner, {})
    assert fs.size("memory:///lake/other.txt") == 1 and fs.glob("memory:///lake/*.txt") == ["/lake/other.txt"]
    assert inner.asked > 0

"""Filesystems of the rollout lake: opening a lake URL, atomic puts, moves and error wrapping.

A lake is a URL: a local folder (made absolute) or `s3://bucket/prefix` through s3fs with the
standard AWS settings (env vars, config files, AWS_ENDPOINT_URL for S3-compatible stores).
Every storage failure surfaces as a LakeError that names the URL and the fix, with credential
values scrubbed out, and an unreachable endpoint fails within seconds.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from storage.schema import SchemaError

CONNECT_TIMEOUT_S = 3  # an unreachable endpoint must fail in seconds, not minutes
READ_TIMEOUT_S = 30
S3_ATTEMPTS = 2  # botocore attempts per request, and s3fs's own retries on top (kept small)


class LakeError(RuntimeError):
    """The lake cannot be reached, read or written; the message names the URL and the fix."""


def _secret_values() -> list[str]:
    names = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
    return [v for v in (os.environ.get(n) for n in names) if v and len(v) >= 4]


def scrub(text: str) -> str:
    """Remove credential values from an error message before it is shown or logged."""
    for value in _secret_values():
        text = text.replace(value, "***")
    return text


@contextmanager
def lake_io(url: str, what: str) -> Iterator[None]:
    """Turn any storage failure inside the block into a LakeError naming the URL and the action."""
    try:
        yield
    except (LakeError, SchemaError):
        raise
    except Exception as exc:  # fsspec backends raise OSError, botocore and aiohttp errors alike
        msg = scrub(f"{type(exc).__name__}: {exc}")
        raise LakeError(f"lake {url}: could not {what}: {msg}") from exc


def s3_options() -> dict[str, Any]:
    """s3fs settings: standard AWS env/config credentials, short timeouts, few retries."""
    options: dict[str, Any] = {
        "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "read_timeout": READ_TIMEOUT_S,
            "retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"},
        },
        "use_listings_cache": False,  # other processes commit steps; never trust a stale listing
    }
    # botocore already honours AWS_ENDPOINT_URL (checked with s3fs 2026.9); passing it explicitly
    # keeps that true for any botocore version and lets error messages name the endpoint.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    return options



def source_options(source: str | Sequence[str]) -> dict[str, Any]:
    """fsspec settings for reading a dataset source (`data.dataset`, `eval.dataset`: one entry or a
    list): the lake's S3 settings when an entry is an s3:// URL, else none (a local filesystem
    ignores them, so a list mixing both still reads)."""
    entries = [source] if isinstance(source, str) else list(source)
    return s3_options() if any(fsspec.utils.get_protocol(e) in ("s3", "s3a") for e in entries) else {}

def _probe_s3(fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
    bucket = root.split("/", 1)[0]
    endpoint = getattr(fs, "endpoint_url", None) or "AWS default"
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except Exception as exc:
        raise LakeError(
            f"lake {url}: cannot reach bucket '{bucket}' at endpoint {endpoint}: "
            f"{scrub(f'{type(exc).__name__}: {exc}')}. Fix: check that the bucket exists, that "
            f"AWS_ENDPOINT_URL points at a running S3 service, and that AWS credentials "
            f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile) are set") from exc


def open_filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Open the filesystem of a lake URL and return it with the root path (no trailing slash).

    Local paths are made absolute. `s3://` uses s3fs with the standard AWS settings plus
    AWS_ENDPOINT_URL, and is probed once so an unreachable store fails now with a LakeError.
    """
    if not url or not url.strip():
        raise LakeError("lake url is empty; set lake.url to a folder or s3://bucket/prefix")
    protocol = fsspec.utils.get_protocol(url)
    if protocol in ("file", "local"):
        if "://" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        fs, path = fsspec.core.url_to_fs(url, auto_mkdir=True)
        return fs, path.rstrip("/") or "/"
    with lake_io(url, "open its filesystem"):
        fs, path = fsspec.core.url_to_fs(url, **(s3_options() if protocol in ("s3", "s3a") else {}))
    root = path.rstrip("/")
    if not root:
        raise LakeError(f"lake url {url!r} names no bucket; use s3://bucket/prefix")
    if protocol in ("s3", "s3a"):
        fs.retries = S3_ATTEMPTS  # s3fs's own retry loop (a class attribute, not an init option)
        _probe_s3(fs, root, url)
    return fs, root


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def put_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes, exclusive: bool) -> bool:
    """Write `data` at `path` all-or-nothing; with `exclusive`, only if nothing is there yet.

    Returns False when `exclusive` and the path already existed. Local files go through a temp
    file plus rename / hard link, so a reader never sees half a file. S3 PUTs are atomic and the
    exclusive case is a conditional PUT (If-None-Match: *), atomic on AWS, MinIO and moto. Callers
    also check existence first, so a store that ignores the condition still only has a race window.
    """
    if is_local(fs):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            if not exclusive:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        fs.pipe_file(path, data, mode="create" if exclusive else "overwrite")
    except FileExistsError:
        return False
    return True


def move(fs: fsspec.AbstractFileSystem, src: str, dst: str) -> None:
    """Move one file (a rename locally, copy-then-delete on S3); `dst` must not exist yet."""
    if is_local(fs):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.link(src, dst)  # fails rather than overwrite an earlier quarantined file
        os.unlink(src)
        return
    fs.copy(src, dst)
    fs.rm_file(src)


def read_parquet_bytes(blob: bytes) -> pa.Table:
    """Decode a whole Parquet file held in memory.

    Not pq.read_table: its dataset scanner can drop the last reference to the Python-owned bytes
    on an Arrow thread while the interpreter exits, which aborts the process ("terminate called
    without an active exception", pyarrow 25). The plain file reader finishes on this thread.
    """
    with pq.ParquetFile(pa.BufferReader(blob)) as f:
        return f.read(use_threads=False)


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def list_files(fs: fsspec.AbstractFileSystem, root: str, url: str, folder: str) -> dict[str, Mapping[str, Any]]:
    """Every file under `folder` as key (relative to the root) -> fsspec info (size, mtime)."""
    with lake_io(url, f"list {folder}/"):
        try:
            found = fs.find(f"{root}/{folder}", detail=True)
        except FileNotFoundError:
            return {}
    start = len(root) + 1
    return {path[start:]: info for path, info in found.items() if info.get("type", "file") == "file"}


def modified_at(info: Mapping[str, Any]) -> float | None:
    """Unix seconds of a file's last change from an fsspec info dict (local or S3), if known."""
    value = info.get("mtime", info.get("LastModified"))
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return float(value) if isinstance(value, (int, float)) else None


class KnownFilesFS(AbstractFileSystem):
    """A lake's remote filesystem as DuckDB sees it: known immutable files answered from memory.

    Each time DuckDB binds a query it globs, sizes and dates every file of a read_parquet list,
    one HTTP request each on S3. Lake data files are never overwritten (unique keys), so the
    listing taken at refresh answers those questions; reads and anything unknown go to `fs`.
    """

    cachable = False  # one per Lake refresh; fsspec must not hand it to anyone else

    def __init__(self, fs: AbstractFileSystem, infos: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__()
        self.fs = fs
        self.protocol = fs.protocol
        self.known = {fs._strip_protocol(path): dict(info) for path, info in infos.items()}

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path  # the wrapped filesystem strips it

    def _info(self, path: str) -> dict[str, Any] | None:
        return self.known.get(self.fs._strip_protocol(path))

    def glob(self, path: str, **kwargs: Any) -> Any:
        return [self.fs._strip_protocol(path)] if self._info(path) is not None else self.fs.glob(path, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._info(path) or self.fs.info(path, **kwargs)

    def size(self, path: str) -> int:
        known = self._info(path)
        return int(known["size"]) if known is not None else self.fs.size(path)

    def modified(self, path: str) -> dt.datetime:
        known = self._info(path)
        stamp = known and (known.get("LastModified") or known.get("mtime"))
        if isinstance(stamp, dt.datetime):
            return stamp
        return self.fs.modified(path)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self._info(path) is not None or self.fs.exists(path, **kwargs)

    def isdir(self, path: str) -> bool:
        return self._info(path) is None and self.fs.isdir(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.fs.ls(path, detail=detail, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        known = self._info(path)
        if known is None or mode != "rb":
            return self.fs._open(self.fs._strip_protocol(path), mode=mode, **kwargs)
        # Size and details given up front spare the HEAD requests behind every open and stat.
        f = self.fs._open(self.fs._strip_protocol(path), mode=mode, size=int(known["size"]), **kwargs)
        f.details = known
        return f

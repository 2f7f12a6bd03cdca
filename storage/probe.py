"""Probes of a run's endpoints before it starts: the lake, the MLflow store, a TCP service (Ray).

Each returns messages, one per problem, each naming the problem and the fix ([] = fine), and
answers within seconds: a bare TCP connect with a short deadline comes before any client whose
own retries take minutes against a host that does not answer (an `ftp://` lake once took 135 s).
Nothing is left behind: local folders and MLflow databases are checked without being created,
and the S3 write probe deletes the one object it puts.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import urlopen

import fsspec

from storage.fs import scrub, s3_options

PROBE_TIMEOUT_S = 2.0
LOCAL_SCHEMES = ("file", "local")
S3_SCHEMES = ("s3", "s3a")
_LAKE_FIX = "use a local folder (e.g. lake) or s3://bucket/prefix"
# MLflow stores and the port each listens on by default (the database schemes of SQLAlchemy).
_DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
_MLFLOW_SCHEMES = ("sqlite", "http", "https", "file", "databricks", "databricks-uc", "uc", *_DB_PORTS)


def tcp_problem(host: str, port: int, what: str, fix: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if `host:port` accepts a TCP connection within `timeout_s`, else a message naming
    `what` and `fix`. The connect (name lookup included) runs in a daemon thread so a resolver
    that hangs cannot hold the caller past the deadline."""
    result: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result.append(None)
        except OSError as exc:
            result.append(exc)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    if result and result[0] is None:
        return None
    reason = f"{type(result[0]).__name__}: {result[0]}" if result else f"no answer within {timeout_s:g} s"
    return f"{what} at {host}:{port} is not reachable ({reason}); {fix}"


def lake_problems(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """Can a run use the lake at `url`: a supported scheme, and a local folder that can be created
    and written, or an S3 endpoint that answers, a bucket that exists and a prefix that takes a put."""
    if not url or not url.strip():
        return [f"lake.url is empty; {_LAKE_FIX}"]
    protocol = fsspec.utils.get_protocol(url)
    if protocol in LOCAL_SCHEMES:
        path = url.split("://", 1)[1] if "://" in url else url
        return _folder_problems(Path(os.path.expanduser(path)).absolute(), f"lake {url}",
                                "set lake.url to a folder you can write")
    if protocol not in S3_SCHEMES:
        return [f"lake.url {url!r}: scheme '{protocol}://' is not supported; {_LAKE_FIX}"]
    return _s3_problems(url, timeout_s)


def _folder_problems(folder: Path, what: str, fix: str) -> list[str]:
    """A folder that exists and is writable, or whose nearest existing parent is (created later)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return [f"{what}: {probe} is a file, not a folder; {fix}"]
    if not os.access(probe, os.W_OK | os.X_OK):
        verb = "is not writable" if probe == folder else f"cannot be created ({probe} is not writable)"
        return [f"{what}: {folder} {verb}; {fix}"]
    return []


def _s3_endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"


def _s3_problems(url: str, timeout_s: float) -> list[str]:
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    if not bucket:
        return [f"lake.url {url!r} names no bucket; use s3://bucket/prefix"]
    endpoint = _s3_endpoint()
    parts = urlsplit(endpoint)
    if parts.hostname is None:
        return [f"AWS_ENDPOINT_URL={endpoint!r} is not a URL; set it to e.g. http://127.0.0.1:9000"]
    unreachable = tcp_problem(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                              f"the S3 endpoint {endpoint} of lake {url}",
                              "start the S3 service or point AWS_ENDPOINT_URL at it", timeout_s)
    if unreachable:
        return [unreachable]
    options = s3_options()
    # One attempt with short timeouts: an endpoint that accepts connections but never answers
    # must not hold the check for the lake's own 30 s read timeout and its retries.
    options["config_kwargs"] = {**options["config_kwargs"], "read_timeout": timeout_s + 1,
                                "retries": {"max_attempts": 1, "mode": "standard"}}
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.retries = 1  # s3fs's own retry loop
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except Exception as exc:  # botocore ClientError, NoCredentialsError, s3fs's translations
        return [_bucket_message(url, bucket, endpoint, exc)]
    probe = f"{root.rstrip('/')}/_preflight/{uuid.uuid4().hex}"
    try:
        fs.pipe_file(probe, b"")
    except Exception as exc:
        return [f"lake {url}: cannot write to bucket '{bucket}' ({scrub(f'{type(exc).__name__}: {exc}')}); "
                "use credentials that may put objects (s3:PutObject) or another lake.url"]
    try:
        fs.rm_file(probe)
    except Exception as exc:
        return [f"lake {url}: wrote {probe} but cannot delete it ({scrub(str(exc))}); delete it by hand and "
                "use credentials that may delete objects (s3:DeleteObject)"]
    return []


def _bucket_message(url: str, bucket: str, endpoint: str, exc: Exception) -> str:
    text = scrub(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, FileNotFoundError) or "404" in text or "NoSuchBucket" in text:
        return (f"lake {url}: bucket '{bucket}' does not exist at {endpoint}; create it "
                f"(aws s3 mb s3://{bucket}) or fix lake.url")
    if "credentials" in text.lower():
        return (f"lake {url}: no AWS credentials ({text}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
    if isinstance(exc, PermissionError) or "403" in text or "AccessDenied" in text:
        return (f"lake {url}: access to bucket '{bucket}' denied at {endpoint} ({text}); check the AWS "
                "credentials and the bucket's policy")
    return f"lake {url}: cannot reach bucket '{bucket}' at {endpoint} ({text}); check lake.url and AWS_ENDPOINT_URL"


def checkpoint_problems(url: str, run_id: str, setting: str) -> list[str]:
    """A run that `setting` (model.init_from_run, --resume) starts from must have a committed
    checkpoint in the checkpoint store at `url`. Call it on a store whose probe passed."""
    from storage.checkpoints import CheckpointStore
    from storage.fs import LakeError

    try:
        steps = CheckpointStore(url).steps(run_id)
    except LakeError as exc:
        return [f"{setting} {run_id}: cannot read the checkpoints in {url} ({exc})"]
    if steps:
        return []
    return [f"{setting} {run_id}: that run has no committed checkpoint in {url}; name a run with checkpoints "
            "(rhymerl lake summary lists the lake's runs; checkpoints live in the lake's _checkpoints, or in "
            "checkpoint.dir if the run set it)"]


def tracking_problems(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """Can a run log to the MLflow store at `uri`: a local SQLite database or folder that can be
    created and written, or a server that answers; nothing is created."""
    if not uri:
        return ["tracking.uri is empty; set it to sqlite:///mlflow.db or http://host:5000"]
    scheme = urlsplit(uri).scheme.split("+", 1)[0]  # postgresql+psycopg2 -> postgresql
    if scheme == "sqlite":
        return _sqlite_problems(uri)
    if scheme in ("http", "https"):
        return _server_problems(uri, timeout_s)
    if scheme in ("", "file"):
        folder = Path(uri.split("://", 1)[1] if "://" in uri else uri).absolute()
        found = _folder_problems(folder, f"tracking.uri {uri}", "set tracking.uri to a folder you can write")
        if not os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true"):
            found.append(f"tracking.uri {uri} is an MLflow file store, which MLflow refuses unless "
                         "MLFLOW_ALLOW_FILE_STORE=true; use sqlite:///mlflow.db instead")
        return found
    if scheme in _DB_PORTS:
        parts = urlsplit(uri)
        problem = tcp_problem(parts.hostname or "localhost", parts.port or _DB_PORTS[scheme],
                              "the MLflow database of tracking.uri", "start the database or fix tracking.uri",
                              timeout_s)
        return [problem] if problem else []
    if scheme in _MLFLOW_SCHEMES:
        return []  # a hosted store: its client checks credentials and reachability
    return [f"tracking.uri {uri!r}: scheme '{scheme}' is not an MLflow store; use sqlite:///mlflow.db or "
            "http://host:5000"]


def _sqlite_problems(uri: str) -> list[str]:
    """sqlite:///relative.db or sqlite:////absolute.db (SQLAlchemy's form): the file or its folder."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///":
        return [f"tracking.uri {uri!r} names no database file; use sqlite:///mlflow.db"]
    db = Path(uri[len("sqlite:///"):]).absolute()
    if db.is_dir():
        return [f"tracking.uri {uri}: {db} is a folder; name a database file, e.g. sqlite:///mlflow.db"]
    if db.is_file():
        with db.open("rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            return [f"tracking.uri {uri}: {db} is not an SQLite database; move it away or name another file"]
        if not os.access(db, os.W_OK):
            return [f"tracking.uri {uri}: {db} is not writable; fix its permissions or name another file"]
        return []
    return _folder_problems(db.parent, f"tracking.uri {uri}", "name a database in a folder you can write")


def _server_problems(uri: str, timeout_s: float) -> list[str]:
    parts = urlsplit(uri)
    if parts.hostname is None:
        return [f"tracking.uri {uri!r} names no host; use http://host:5000"]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    problem = tcp_problem(parts.hostname, port, f"the MLflow server of tracking.uri {uri}",
                          "start it (rhymerl ui, or mlflow server) or set tracking.uri=sqlite:///mlflow.db",
                          timeout_s)
    if problem:
        return [problem]
    try:  # MLflow servers answer GET /health with "OK"
        with urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as response:
            if response.status == 200:
                return []
            status = f"HTTP {response.status}"
    except Exception as exc:  # HTTPError, URLError, timeouts
        status = f"{type(exc).__name__}: {exc}"
    return [f"tracking.uri {uri} answers but not as an MLflow server ({status} at /health); point "
            "tracking.uri at the MLflow server"]

"""Exported models next to the lake: a run's policy as a Hugging Face folder.

    <lake>/_exports/<run_id>/    config.json, model.safetensors, generation_config.json, tokenizer files

A finished run stores its final weights there (`tasks/export.py`); `rhymerl export` writes any
committed checkpoint to a folder or URL of the user's choice. Either way the folder is first
written whole on local disk (`staged_export`) and only then published:

* a local target is a rename of a folder written beside it, so a reader sees no folder or a
  complete one (a replaced folder is moved aside first, then deleted);
* an fsspec target (`s3://...`) gets the files one by one, `config.json` last: a folder without
  it is not a model yet to `from_pretrained` or vLLM. A replaced folder is deleted first.

The store only moves files: what they hold is `rhymerl.policy.export`'s business.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from storage.fs import LakeError, is_local, lake_io, open_filesystem
from storage.layout import check_key

__all__ = ["EXPORTS_DIR", "export_url", "staged_export"]

EXPORTS_DIR = "_exports"
LAST_FILE = "config.json"  # published last: its presence marks a complete folder on S3


def export_url(lake_url: str, run_id: str) -> str:
    """Where a run's final model goes: `<lake>/_exports/<run_id>`, absolute for a local lake (the
    trainer actor that writes it has another working directory)."""
    check_key(run_id, 0, 0)
    root = lake_url if "://" in lake_url else os.path.abspath(os.path.expanduser(lake_url))
    return f"{root.rstrip('/')}/{EXPORTS_DIR}/{run_id}"


@contextmanager
def staged_export(url: str, replace: bool = False) -> Iterator[Path]:
    """A local folder path (not created) to write the model into; published at `url` when the
    block ends without an error, discarded otherwise. An existing `url` is a LakeError (before
    the block runs) unless `replace`."""
    fs, path = open_filesystem(url)  # an unreachable store fails here, naming the fix
    with lake_io(url, "look for an earlier export"):
        exists = fs.exists(path)
    if exists and not replace:
        raise LakeError(f"{url} already exists; remove it or choose another folder")
    local = is_local(fs)
    if local:  # beside the target: the publishing rename stays on one filesystem
        os.makedirs(os.path.dirname(path), exist_ok=True)
        scratch = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        folder = Path(scratch)
    else:
        scratch = tempfile.mkdtemp(prefix="rhymerl-export-")
        folder = Path(scratch) / "model"
    try:
        yield folder
        if not (folder / LAST_FILE).is_file():
            raise LakeError(f"the export for {url} wrote no {LAST_FILE}; nothing was published")
        with lake_io(url, "publish the exported model"):
            (_publish_local if local else _publish_remote)(fs, folder, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish_local(fs: Any, folder: Path, path: str) -> None:
    old = f"{path}.old-{uuid.uuid4().hex[:8]}"
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(folder, path)
    shutil.rmtree(old, ignore_errors=True)


def _publish_remote(fs: Any, folder: Path, path: str) -> None:
    if fs.exists(path):
        fs.rm(path, recursive=True)
    for file in sorted(folder.iterdir(), key=lambda f: (f.name == LAST_FILE, f.name)):
        fs.put_file(str(file), f"{path}/{file.name}")

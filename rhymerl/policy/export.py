"""Export a trained policy as a Hugging Face model folder that `AutoModelForCausalLM` loads.

`read_checkpoint_weights(location)` gives the full state dict (HF names -> whole CPU tensors) of
a trainer checkpoint in either of the run's formats (`state_weights(blob, where)`: from a
one-rank checkpoint's bytes, as `storage.checkpoints` hands them out after checking their digest):

* a one-rank ``trainer.pt``: `torch.save` of `Trainer.state()`, a dict whose ``"model"`` holds the
  state dict (read with ``weights_only=True``);
* a torch.distributed.checkpoint folder (``.metadata`` plus ``.distcp`` files, written by
  `rhymerl.policy.checkpoint.save_trainer` from any number of ranks): only its ``"model"`` entries
  are read, resharded to whole tensors, in this process with no process group;
* a checkpoint step folder (`storage.checkpoints`) holding either of the two.

Locations are local paths or fsspec URLs (``s3://``, with `storage_options`).

`export_hf(weights, source_model_dir, out_dir)` writes the folder: ``config.json`` (the source's,
with `dtype` set to the weights' floating dtype), ``model.safetensors`` (tied weights stored
once, as `save_pretrained` does), ``generation_config.json`` (the source's, else derived from the
config) and the tokenizer: the given tokenizer saved, or else the source's tokenizer files
copied. The weights must match the source architecture: an unknown or missing name is an
`ExportError`. The folder is written beside `out_dir` and renamed into place, so `out_dir` is
either absent or complete; an existing `out_dir` is refused.
"""

from __future__ import annotations

import io
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, Mapping

import fsspec
import torch
from torch import Tensor

from rhymerl.policy.trainer import TOKENIZER_FILES

DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index, written last
ONE_RANK_FILE = "trainer.pt"  # storage.checkpoints: a one-rank trainer state
SHARDED_DIR = "trainer"  # storage.checkpoints: a sharded trainer state


class ExportError(ValueError):
    """A checkpoint cannot be read or exported; the message names it and the fix."""


def read_checkpoint_weights(location: str | Path,
                            storage_options: Mapping[str, Any] | None = None) -> dict[str, Tensor]:
    """The policy's full state dict from a checkpoint (formats in the module docstring)."""
    opts = dict(storage_options or {})
    url = str(location).rstrip("/")
    fs, path = fsspec.core.url_to_fs(url, **opts)
    if fs.isdir(path):
        if fs.isfile(f"{path}/{ONE_RANK_FILE}"):
            path, url = f"{path}/{ONE_RANK_FILE}", f"{url}/{ONE_RANK_FILE}"
        elif fs.isfile(f"{path}/{SHARDED_DIR}/{DCP_METADATA}"):
            path, url = f"{path}/{SHARDED_DIR}", f"{url}/{SHARDED_DIR}"
    if fs.isfile(path):
        return _one_rank(fs, path, url)
    if fs.isfile(f"{path}/{DCP_METADATA}"):
        return _sharded(url, opts)
    raise ExportError(f"{url} is not a checkpoint: give a {ONE_RANK_FILE} file, a torch.distributed.checkpoint "
                      f"folder (with {DCP_METADATA}) or a checkpoint step folder holding one of them")


def _one_rank(fs: Any, path: str, url: str) -> dict[str, Tensor]:
    return state_weights(fs.cat_file(path), url)


def state_weights(blob: bytes, where: str) -> dict[str, Tensor]:
    """The state dict in the bytes of a one-rank ``trainer.pt`` (read from `where`, for errors)."""
    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ExportError(f"{where} cannot be read as a torch checkpoint: {type(exc).__name__}: {exc}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ExportError(f"{where} holds no 'model' state dict; give what Trainer.state() saved (trainer.pt)")
    return dict(state["model"])


def _sharded(url: str, storage_options: dict[str, Any]) -> dict[str, Tensor]:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    try:
        with warnings.catch_warnings():  # it warns that it loads without a process group: that is the intent
            warnings.simplefilter("ignore")
            state = _load_state_dict_from_keys({"model"}, storage_reader=FsspecReader(url, **storage_options))
    except Exception as exc:
        raise ExportError(f"{url} cannot be read as a torch.distributed.checkpoint folder: "
                          f"{type(exc).__name__}: {exc}") from exc
    model = state.get("model")
    if not isinstance(model, dict) or not model:
        raise ExportError(f"{url} holds no 'model' entries; give a folder written by rhymerl.policy.checkpoint")
    return {name: t.to_local() if hasattr(t, "to_local") else t for name, t in model.items()}


def _model_with(weights: Mapping[str, Tensor], source: Path) -> Any:
    """The source architecture holding `weights` (assigned, not copied); ExportError on a name mismatch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    floats = [t.dtype for t in weights.values() if t.is_floating_point()]
    if floats:
        config.dtype = floats[0]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    result = model.load_state_dict(dict(weights), strict=False, assign=True)
    model.tie_weights()
    missing = sorted(n for n, t in model.state_dict().items() if t.is_meta)
    if result.unexpected_keys or missing:
        raise ExportError(f"the weights do not fit {source}'s architecture: unknown names "
                          f"{sorted(result.unexpected_keys)[:5]}, missing names {missing[:5]}; export with "
                          "the model folder the run trained (model.path)")
    return model


def export_hf(weights: Mapping[str, Tensor], source_model_dir: str | Path, out_dir: str | Path,
              tokenizer: Any = None) -> Path:
    """Write the HF folder (module docstring) and return `out_dir`."""
    from transformers import GenerationConfig

    source, out = Path(source_model_dir), Path(out_dir)
    if not (source / "config.json").is_file():
        raise ExportError(f"{source} has no config.json; give the model folder the run started from (model.path)")
    if out.exists():
        raise ExportError(f"{out} already exists; remove it or choose another folder")
    model = _model_with(weights, source)
    if (source / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(source)
    else:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        else:
            for name in TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copyfile(source / name, tmp / name)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_checkpoint(location: str | Path, source_model_dir: str | Path, out_dir: str | Path,
                      storage_options: Mapping[str, Any] | None = None, tokenizer: Any = None) -> Path:
    """`export_hf` of `read_checkpoint_weights(location)`: a run's checkpoint as a loadable model."""
    return export_hf(read_checkpoint_weights(location, storage_options), source_model_dir, out_dir, tokenizer)

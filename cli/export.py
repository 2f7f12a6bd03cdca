"""`rhymerl export RUN_ID [--epoch N] OUT [--lake URL]`: a run's checkpoint as a Hugging Face folder.

    rhymerl export rhymerl-20250101-120000-ab12 ./my-model
    rhymerl export rhymerl-20250101-120000-ab12 --epoch 3 s3://bucket/models/epoch3 --lake s3://bucket/lake

The checkpoint is the run's newest committed one, or with `--epoch N` the newest one of epoch N
(only the last `checkpoint.keep` are kept). Where the checkpoints are and which model folder gives
the config and tokenizer (`model.path`, or the built-in model, built if this machine has none
cached) come from the config the run stored in the lake. OUT is a new local folder or an fsspec
URL. An unknown run or epoch, a run without checkpoints or an existing OUT is one line on stderr
naming the problem and the fix (exit code 2), found before any weight is read. A finished run's
final model is already at `<lake>/_exports/<run_id>` (docs/exported-models.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cli.common import guarded, lake_url, run_alone


def _run_config(url: str, run_id: str) -> Any:
    """The RunConfig the run stored in the lake's runs table; ValueError listing the runs if absent."""
    from rhymerl.config.run import config_from_dict
    from storage.lake import Lake

    with Lake(url) as lake:
        rows = lake.sql("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).to_pylist()
        runs = [] if rows else sorted(r["run_id"] for r in lake.sql("SELECT run_id FROM runs").to_pylist())
    if not rows:
        known = ", ".join(runs[-10:]) if runs else "none"
        raise ValueError(f"lake {url} has no run {run_id!r} (its runs: {known}); give one of them, or the "
                         "lake the run wrote to with --lake")
    return config_from_dict(json.loads(rows[0]["config_json"]))


def pick_checkpoint(store: Any, run_id: str, epoch: int | None, every_steps: int = 1) -> int:
    """The global step to export: the newest committed checkpoint (of `epoch`, when given)."""
    steps = store.steps(run_id)
    if not steps:
        raise ValueError(f"run {run_id} has no committed checkpoint in {store.url} (it wrote one every "
                         f"{every_steps} step(s), checkpoint.every_steps; 0 = none); nothing to export")
    if epoch is None:
        return steps[-1]
    epochs = {step: int(store.meta(run_id, step)["epoch"]) for step in steps}
    found = [step for step in steps if epochs[step] == epoch]
    if not found:
        have = ", ".join(f"epoch {e} (global step {s})" for s, e in epochs.items())
        raise ValueError(f"run {run_id} has no checkpoint of epoch {epoch}; its checkpoints: {have} (older ones "
                         "are pruned, checkpoint.keep); pick one of those epochs, or leave out --epoch for the newest")
    return found[-1]


def _source_dir(cfg: Any) -> Path:
    """The model folder the run started from: model.path, or the built-in model of its dataset."""
    if cfg.model.path:
        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            raise ValueError(f"the run's model.path {cfg.model.path!r} is not a model folder on this machine "
                             "(no config.json); export where that folder is")
        return path
    from rhymerl.policy.build import ensure_builtin_model
    from rhymerl.policy.long_build import build_settings_for

    return ensure_builtin_model(spec=build_settings_for(cfg.data.dataset))


def cmd_export(args: argparse.Namespace) -> int:
    from storage.checkpoints import CheckpointStore, checkpoint_url
    from storage.exports import staged_export

    url = lake_url(args)
    cfg = _run_config(url, args.run_id)
    store = CheckpointStore(checkpoint_url(url, cfg.checkpoint.dir))
    step = pick_checkpoint(store, args.run_id, args.epoch, cfg.checkpoint.every_steps)
    with staged_export(args.out) as folder:  # refuses an existing OUT before anything is read
        source = _source_dir(cfg)
        from transformers.utils.logging import disable_progress_bar

        from rhymerl.policy.export import export_hf, read_checkpoint_weights, state_weights

        disable_progress_bar()  # the one line this command prints is the result

        ckpt = store.load(args.run_id, step)  # digests checked
        weights = (read_checkpoint_weights(ckpt.trainer_url, store.storage_options()) if ckpt.sharded
                   else state_weights(ckpt.trainer_state, f"checkpoint {args.run_id} global step {step}"))
        export_hf(weights, source, folder)
    meta = ckpt.meta
    print(f"exported run {args.run_id} at epoch {meta.get('epoch')} step {meta.get('step')} (global step {step}, "
          f"policy version {meta.get('policy_version')}) to {args.out}")
    return 0


def register(subparsers: Any) -> None:
    """Add `export` to a `rhymerl` subparsers object."""
    export = subparsers.add_parser(
        "export", help="a run's checkpoint as a Hugging Face model folder (transformers, vLLM)",
        description="Write a run's newest committed checkpoint (or its last of --epoch N) as a folder that "
                    "AutoModelForCausalLM.from_pretrained and vllm.LLM load: config, model.safetensors, "
                    "generation config and tokenizer. Sharded (train.world_size > 1) checkpoints too.")
    export.add_argument("run_id", metavar="RUN_ID", help="the run (its id as `rhymerl run` printed it)")
    export.add_argument("out", metavar="OUT", help="a new folder, or an fsspec URL (s3://bucket/prefix)")
    export.add_argument("--epoch", type=int, metavar="N", help="the last checkpoint of epoch N (default: the newest)")
    export.add_argument("--lake", metavar="URL",
                        help="lake folder or s3://bucket/prefix (default: $RHYMERL_LAKE, else ./lake)")
    export.set_defaults(func=guarded(cmd_export))


def main(argv: list[str] | None = None) -> int:
    """`python -m cli.export export ...`: the command without the rest of `rhymerl`."""
    return run_alone(register, argv)


if __name__ == "__main__":
    sys.exit(main())

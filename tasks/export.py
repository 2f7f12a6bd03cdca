"""The run's final model out as a Hugging Face folder, once its last step has trained.

The trainer actor hands out its weights as the files of a Hugging Face folder; this task stores
them at `<lake>/_exports/<run_id>` (`storage.exports`), replacing the folder of an earlier attempt
of the same run. The path goes to MLflow as the tag `rhymerl.export` and to the end-of-run summary.
For the built-in model this is a fraction of a second; for a large model it is one more gather of
the weights on the trainer, and the weights' bytes once through Ray's object store to this process.
"""

from __future__ import annotations

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from storage.exports import export_url, staged_export
from tasks.setup import RunContext, Tracking

EXPORT_TAG = "rhymerl.export"  # MLflow tag holding the exported folder's path or URL


@task(name="export-model", cache_policy=NO_CACHE)
def export_task(ctx: RunContext, trainer, tracking: Tracking | None) -> str:
    """Write the trainer's weights as the run's exported model; returns its path or URL."""
    url = export_url(ctx.cfg.lake.url, ctx.run_id)
    files = ray.get(trainer.export_files.remote())
    with staged_export(url, replace=True) as folder:
        folder.mkdir()
        for name, blob in files.items():
            (folder / name).write_bytes(blob)
    if tracking is not None:
        tracking.tracker.set_tags({EXPORT_TAG: url})
    get_run_logger().info("run %s: final model exported to %s", ctx.run_id, url)
    return url

"""Per arm and train.stream setting: mean step (wall_s), rollout_s, train_s, trainer compute seconds, over epochs >= 1.

Reads the benchmark outputs next to this file (stream-*/runs/*.json)."""
import json, statistics
from pathlib import Path

for out in sorted(str(p) for p in Path(__file__).parent.glob("stream-*")):
    for f in sorted(Path(out, "runs").glob("*.json")):
        d = json.loads(f.read_text())
        hist = [h for h in d["history"] if h["epoch"] >= 1]
        m = lambda k: statistics.fmean(h.get(k, float("nan")) for h in hist)
        print(f"{out} {d['arm']:9s} steps={len(hist)} stream={d['config']['train']['stream']} "
              f"wall_s={m('wall_s'):.2f} rollout_s={m('rollout_s'):.2f} train_s={m('train_s'):.2f} "
              f"train_seconds={m('train_seconds'):.2f} reward_s={m('reward_s'):.2f} sync_s={m('sync_s'):.2f} "
              f"streamed={[h.get('train_streamed') for h in hist]} load_start={d.get('loadavg_start')}")

"""Write the analytic roofline cost surface (H100 SXM and H200 SXM; Qwen2.5 0.5B, 1.5B and 7B shapes).

    .venv/bin/python scripts/roofline-surface.py [--out bench/results/cost-surface-roofline.json]
                                                 [--overhead-ms 1.0]

The formula, the devices' datasheet figures and the assumptions are in
`rhymerl.histopipe.roofline` and in the file it writes; `rhymerl bench e2e --cost-json <file>
--cost-model qwen2-7b@h200` uses it where no measured surface (scripts/gpu-costmodel.py) exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from rhymerl.histopipe.roofline import RooflineSettings, surface_doc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/cost-surface-roofline.json")
    p.add_argument("--overhead-ms", type=float, default=RooflineSettings().overhead_s * 1e3,
                   help="fixed cost of a step beyond the roofline, in ms")
    args = p.parse_args(argv)
    doc = surface_doc(settings=RooflineSettings(overhead_s=args.overhead_ms / 1e3))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}: {len(doc['models'])} models, {sum(len(m['points']) for m in doc['models'].values())} points",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

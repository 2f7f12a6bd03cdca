"""One `new` arm of spec-scale at issue 17's point, from the tree given (A/B)."""
import sys, json
sys.path.insert(0, sys.argv[1])
import numpy as np
from dataclasses import replace
from bench import spec_scale_bench as b
spec = b.SPEC if sys.argv[2] == "prompt" else b.ENGINE_SPEC
rng = np.random.default_rng(0)
bundle, groups, rows, n0 = b._batch(rng, 16384, 16, 256)
r = b._draft_new(bundle, rows, n0, 256, int(sys.argv[3]), replace(spec, grow_behind="on"), batched=True)
print("%s step_ms %.3f wall %.3f acc %.3f stall %.1f" % (sys.argv[1], r["step_ms"], r["step_wall_ms"], r["acceptance_rate"], r["stall_ms"]))

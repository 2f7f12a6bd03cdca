"""Does an idle vLLM engine burn CPU? CPU seconds of its processes in the seconds after each call.

    .venv/bin/python scripts/engine-idle-cpu.py MODEL_DIR

Starts one `vllm.LLM` on MODEL_DIR (any small model, e.g. the built-in one under .cache), then
after a generate call and after a `collective_rpc` prints the CPU seconds each engine process spent
in the first second and in the three seconds after it, while nothing runs. Without a fix, the
`VLLM::Worker` process spends about a CPU second in the first idle second after every call:
vLLM's shared-memory RPC queue busy-polls (`sched_yield`) for `busy_loop_s` = 1 s after each read
before it sleeps on a socket, CPU taken from whatever runs right after a rollout or a weight sync
(reward, training, logging) on a machine with few cores.

RhymeRL's vLLM plugin (`rhymerl/vllm/idle.py`, loaded by vLLM in every process) removes that
busy-poll; this script shows the difference, with the plugin and with it filtered out
(`VLLM_PLUGINS=arctic_inference .venv/bin/python scripts/engine-idle-cpu.py MODEL_DIR`).
Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import os
import sys
import time

import psutil


def cpu_by_process() -> dict[int, tuple[str, float]]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            out[p.pid] = (" ".join(p.cmdline())[:40].strip(), t.user + t.system)
        except psutil.Error:
            pass
    return out


def window(label: str, seconds: float) -> None:
    before = cpu_by_process()
    time.sleep(seconds)
    after = cpu_by_process()
    spent = {name: round(s - before.get(pid, (name, s))[1], 2) for pid, (name, s) in after.items()}
    print(f"{label}: {spent}", flush=True)


def main(model: str) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, disable_log_stats=True)
    for i in range(2):
        llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])] * 8, SamplingParams(max_tokens=32), use_tqdm=False)
        window(f"after generate {i}, first second", 1.0)
        window(f"after generate {i}, next 3 seconds", 3.0)
    llm.collective_rpc("check_health")
    window("after a collective_rpc, first second", 1.0)
    window("after a collective_rpc, next 3 seconds", 3.0)
    return 0


if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
    sys.exit(main(sys.argv[1]))

"""Ad-hoc: spec bench with variant SpecConfigs; reports engine CPU seconds per timed generate
(robust to a loaded machine). usage: exp.py name=k:v,k:v ..."""
import os, sys, statistics, psutil, time
import bench.spec_bench as sb
from rhymerl.histospec.drafter import SpecConfig

CPU = {}
_orig_run_arm = sb.run_arm


def cpu_all():
    t = 0.0
    for p in [psutil.Process()] + psutil.Process().children(recursive=True):
        try:
            c = p.cpu_times(); t += c.user + c.system
        except psutil.Error:
            pass
    return t


def run_arm(name, spec, base, prompts, sampling, history, repeats, bundle_path, keep_engine=None):
    eng_cls = sb.VllmEngine
    cpus = []
    orig = None

    def wrap(engine):
        g = engine.generate
        def gen(ps, s):
            if s is sampling:
                c0 = cpu_all(); out = g(ps, s); cpus.append(cpu_all() - c0); return out
            return g(ps, s)
        engine.generate = gen
        return engine
    class E(eng_cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k); wrap(self)
    sb.VllmEngine = E
    if keep_engine is not None:
        wrap(keep_engine)
    try:
        r, e = _orig_run_arm(name, spec, base, prompts, sampling, history, repeats, bundle_path, keep_engine)
    finally:
        sb.VllmEngine = eng_cls
    timed = cpus[-repeats:]
    CPU[name] = statistics.median(timed)
    print(f"CPU {name}: {CPU[name]:.2f} s (timed {[round(c,2) for c in timed]})", file=sys.stderr)
    return r, e


def main():
    import os
    if os.environ.get("S7_TRACE"):
        import rhymerl.vllm.speculation as sp
        sp.PROPOSER_CLASS = "s7trace.TracedProposer"
    sb.run_arm = run_arm
    names = ["plain"]
    for a in sys.argv[1:]:
        name, _, kv = a.partition("=")
        kw = {}
        for item in filter(None, kv.split(",")):
            k, v = item.split(":")
            d = getattr(SpecConfig(), k)
            kw[k] = (v.lower() == "true") if isinstance(d, bool) else type(d)(v)
        sb.ARMS[name] = SpecConfig(**kw)
        names.append(name)
    rep = sb.run_bench(sb.parser().parse_args(["--prompts", "32", "--arms", ",".join(names), "--repeats", os.environ.get("S7_REPEATS", "3")]))
    print(sb.format_report(rep))
    for n in names:
        print(f"{n}: cpu {CPU[n]:.2f} s  cpu-speedup {CPU['plain']/CPU[n]:.2f}x")


if __name__ == "__main__":
    main()

"""The end-to-end benchmark: RhymeRL against the same system without HistoSpec and HistoPipe.

`python -m bench.e2e` (or `rhymerl bench e2e`) runs it; `bench.py` is the entry (arguments, runs).

- bench.py     the entry: parses arguments, runs each (seed, arm) as a child process, collects runs
- cpu.py       CPU seconds of every process of a run, per part of each step
- analysis.py  pure functions over the saved runs: splits, comparisons, permutation tests
- scale.py     the cluster-scale estimate (Amdahl over the measured split, simulated arms)
- report.py    builds the report (JSON and text) and writes REPORT.md and its plots
- markdown.py  the report's Markdown form
- format.py    labels and number formats the text and Markdown forms share
- plots.py     the report's PNG plots (matplotlib)
"""

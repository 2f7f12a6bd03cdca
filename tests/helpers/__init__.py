"""What several test modules share, imported as `helpers.<module>` (tests/ is on sys.path through
its conftest.py).

- marks.py           skip conditions, each defined once: arctic-inference, vLLM, Chromium, docker-compose
- feed.py            a trainer stand-in that records the streamed-training feed's calls
- infra.py           docs/cluster.md's settings table, YAML loading, k8s pod templates, the cluster's keys
- proc.py            killing a real actor process and waiting until it is gone
- sharded.py         a tiny tied Qwen2 and a batch of uneven examples for the sharded-training tests
- lossless_stats.py  goodness of fit of sampled tokens against the model's exact conditionals
- secret_scan.py     scanning every file a run wrote for a secret
- rewards.py         a run's lake rewards recomputed from its reward functions, and its reward/<name> metrics
"""

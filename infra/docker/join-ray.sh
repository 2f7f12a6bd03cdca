#!/bin/sh
# Join the Ray cluster at $RAY_ADDRESS as a node with no CPUs or GPUs, then run the given command.
# A process on a Ray node can be a Ray driver (ray.init(address=RAY_ADDRESS)); a process outside
# the cluster would need Ray Client instead. Nothing is scheduled on this node: it only hosts drivers.
set -eu
: "${RAY_ADDRESS:?set RAY_ADDRESS to the Ray head (host:6379)}"
ray start --address="$RAY_ADDRESS" --num-cpus=0 --num-gpus=0 --disable-usage-stats
exec "$@"

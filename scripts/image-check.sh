#!/bin/sh
# `make image-check`: build the CPU image (infra/docker/cpu.Dockerfile) and start RhymeRL in it
# (scripts/check-install.sh: `rhymerl --help`, `rhymerl run --print-config`, the flows, actors and
# CLI import). Uses the first builder that works: docker (its daemon must answer), podman, buildah.
# Without one it says so and exits 0: tests/infra/test_image_files.py checks the same commands on
# the image's files, rebuilt without a builder. Otherwise the exit status is the check's.
set -eu
cd "$(dirname "$0")/.."
TAG="${IMAGE_CHECK_TAG:-rhymerl-cpu:check}"

tool=""
for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then
        tool="$candidate"
        break
    fi
done

case "$tool" in
docker | podman)
    "$tool" build -f infra/docker/cpu.Dockerfile -t "$TAG" .
    "$tool" run --rm "$TAG" sh scripts/check-install.sh
    ;;
buildah)
    buildah bud -f infra/docker/cpu.Dockerfile -t "$TAG" .
    ctr=$(buildah from "$TAG")
    trap 'buildah rm "$ctr" >/dev/null' EXIT
    buildah run "$ctr" -- sh scripts/check-install.sh
    ;;
*)
    echo "image-check: no working container builder here (docker with a running daemon, podman or buildah); nothing built."
    for candidate in docker podman buildah; do
        if command -v "$candidate" >/dev/null; then
            echo "image-check: $candidate is installed, but '$candidate info' fails (is its daemon or service running?)."
        fi
    done
    echo "image-check: tests/infra/test_image_files.py checks the image's files without one."
    ;;
esac

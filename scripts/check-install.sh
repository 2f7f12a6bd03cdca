#!/bin/sh
# Does an installed RhymeRL start? The command line answers, a configuration resolves, and the
# flows, the Ray actors and the CLI import. `make image-check` runs it inside the built CPU image;
# tests/infra/test_image_files.py runs it in a fresh virtual environment holding the image's files.
# It works from an empty temporary folder, so what runs is the installed package, never a source
# tree that happens to be the working directory. Exits non-zero at the first command that fails.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
set -x
rhymerl --help >/dev/null
rhymerl run --print-config >/dev/null
# Lightest first: a package missing from the install fails at once, before torch and Prefect load.
python -c "import cli.main, workers.actors, flows.run"
set +x
echo "check-install: rhymerl starts from $(python -c 'import cli, os; print(os.path.dirname(os.path.dirname(cli.__file__)))')"

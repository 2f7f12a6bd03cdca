"""The `rhymerl` command line: the only layer that parses arguments (tests/test_layering.py).

`main` (the `rhymerl` entry point: run, model, ui, lake, spec, bench), `lake` (`rhymerl lake`),
`spec_replay` (`rhymerl spec replay`), `ui` (`rhymerl ui`), `common` (lake URL, output formats, errors).
Dependencies: cli -> flows -> tasks -> workers -> rhymerl, storage.
"""

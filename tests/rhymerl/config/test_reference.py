"""The configuration reference: every setting has a help line, and docs/configuration.md is current."""

import dataclasses

from rhymerl.config.options import help_of
from rhymerl.config.reference import BEGIN, END, PAGE, render, sections, splice
from rhymerl.config.run import RunConfig


def test_every_setting_has_a_help_line():
    # Rule: a setting without help would be an undocumented knob.
    missing = [r.key for _, _, rows in sections() for r in rows if not r.help.strip()]
    assert missing == []
    assert help_of(dataclasses.fields(RunConfig)[0])  # help is read from the field itself


def test_reference_lists_every_key_with_its_type_default_and_values():
    rows = {r.key: r for _, _, rs in sections() for r in rs}
    assert {"train.dtype", "rollout.enforce_eager", "placement.share_gpu", "spec.history_epochs"} <= set(rows)
    assert (rows["epochs"].type, rows["epochs"].default) == ("int", "10")
    assert rows["train.betas"].default == "[0.9, 0.99]" and rows["data.prompt_template"].default == '"{question}\\n"'
    assert rows["train.loss_agg"].allowed == '"token", "sequence"'  # from the Literal type
    assert rows["pipe.gantt"].allowed == "true, false"


def test_configuration_page_is_up_to_date():
    page = PAGE.read_text()
    assert BEGIN in page and END in page, f"{PAGE} lost its generated-block markers"
    assert splice(page, render()) == page, (
        "docs/configuration.md is out of date with the config dataclasses: run `make docs` "
        "(= .venv/bin/python -m rhymerl.config.reference) and commit the page")

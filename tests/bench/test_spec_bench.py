"""`rhymerl bench spec`'s command line: extra arms from spec.* settings, and bad ones refused fast."""

from __future__ import annotations

import pytest

from bench.spec_bench import main, parse_variant, parser, round_order


def test_a_variant_is_an_arm_with_those_settings():
    name, spec = parse_variant("tight=min_token_prob=0.1,max_spec_factor=1.0,budget_rule=\"fixed\"")
    assert name == "tight" and (spec.min_token_prob, spec.max_spec_factor, spec.budget_rule) == (0.1, 1.0, "fixed")


@pytest.mark.parametrize("text, says", [("tight", "expected NAME=key=value"),
                                        ("x=min_token_prob=oops", "not TOML"),
                                        ("x=no_such_key=1", "spec.* settings"),
                                        ("x=min_token_prob=2.0", "spec.min_token_prob")])
def test_bad_variants_exit_2_naming_the_problem(text, says, capsys):
    assert main(["--variant", text]) == 2
    assert says in capsys.readouterr().err


def test_the_dataset_is_one_of_the_built_in_tasks(capsys):
    assert parser().parse_args(["--dataset", "builtin-long"]).dataset == "builtin-long"
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--dataset", "gsm8k"])
    assert exc.value.code == 2 and "builtin-long" in capsys.readouterr().err


def test_the_arms_alternate_every_arm_taking_every_place():
    names = ["plain", "siblings", "suffix", "ngram"]
    orders = [round_order(names, r) for r in range(len(names))]
    assert all(sorted(o) == sorted(names) for o in orders)  # every round times every arm once
    for place in range(len(names)):  # over as many rounds as arms, each arm runs once in each place
        assert sorted(o[place] for o in orders) == sorted(names)
    assert round_order(names, len(names)) == names

"""The exception table of the Python package and the Go core's resume rules are one mapping:
every rule a load can fail by (loader.Rules, written to loader/testdata/rules.txt by the Go test
TestRulesFileIsCurrent) has its exception type here, and no other name does."""

import os

from ckptkit import errors

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loader", "testdata", "rules.txt")


def test_every_rule_of_the_go_core_has_its_exception():
    with open(RULES) as f:
        rules = f.read().split()
    assert rules, RULES
    assert sorted(errors._BY_RULE) == sorted(rules)


def test_from_abi_takes_the_rule_then_the_class():
    e = errors.from_abi(errors.BAD_CHECKPOINT, "partial-optimizer-state", "parameter 'w' lacks exp_avg_sq")
    assert type(e) is errors.PartialStateError and e.rule == "partial-optimizer-state"
    e = errors.from_abi(errors.BAD_CHECKPOINT, "missing-object", "rank-00000-000.data is missing")
    assert type(e) is errors.BadCheckpointError and e.rule == "missing-object"
    e = errors.from_abi(errors.NOT_FOUND, "", "no such path")
    assert type(e) is errors.NotFoundError and e.rule is None

"""Typed seams (#38 item 6): what a backend answers a change of a running job is a dataclass,
read by its fields, that still reads as the dict it was (notebooks written against those run)."""

from __future__ import annotations

import pytest

from notebook_elastic.backends.base import DrillAnswer, RangeAnswer, ScaleAnswer


def test_an_answer_reads_by_its_fields_and_as_the_dict_it_was():
    preempted = DrillAnswer(node="node-1", target=2, grace_s=30.0)
    assert preempted.node == "node-1" and preempted.grace_s == 30.0 and preempted.rank is None
    # The supervisor's dict named only what it had: a field without a value is no key.
    assert dict(preempted) == {"node": "node-1", "target": 2, "grace_s": 30.0}
    assert preempted["node"] == "node-1" and preempted.get("rank") is None and "rank" not in preempted
    with pytest.raises(KeyError):
        preempted["rank"]
    assert preempted == {"node": "node-1", "target": 2, "grace_s": 30.0}
    assert DrillAnswer(node="w-0") == {"node": "w-0"}  # a pod evicted on a cluster
    # False is an answer, not a missing value: the range was already that.
    assert dict(RangeAnswer(target=2, reconfigured=False)) == {"target": 2, "reconfigured": False}
    assert dict(RangeAnswer(target=2, reconfigured=True, epoch=3)) == {"target": 2, "reconfigured": True, "epoch": 3}
    assert ScaleAnswer(target=3) == {"target": 3} and ScaleAnswer(3).target == 3

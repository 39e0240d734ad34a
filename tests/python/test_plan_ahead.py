"""Planning ahead from Python (zeppelin.plan.plan_ahead): the plan made on a
thread of its own is the plan plan_batch makes of the same input, and the
call returns before the planning is done."""

import random

import pytest

import zeppelin
from zeppelin.plan import plan_ahead


def test_plan_ahead_is_the_synchronous_plan():
    rng = random.Random(7)
    batches = [[rng.randint(1, 200000 if b == 0 else 20000) for _ in range(rng.randint(50, 400))] for b in range(3)]
    pending = [plan_ahead(lens, 32, nodes=4, nics_per_node=4) for lens in batches]
    for lens, ahead in zip(batches, pending):
        got = ahead.wait()
        want = zeppelin.plan_batch(lens, 32, nodes=4, nics_per_node=4)
        assert [got.sequence(s) for s in range(len(lens))] == [want.sequence(s) for s in range(len(lens))]
        for r in range(32):
            assert got.attention_layout.segments(r) == want.attention_layout.segments(r)
            assert got.linear_layout.segments(r) == want.linear_layout.segments(r)
        with pytest.raises(zeppelin.InvalidUsage):
            ahead.wait()


def test_plan_ahead_reports_the_planners_refusal():
    with pytest.raises(zeppelin.InvalidArgument):
        plan_ahead([], 4)
    ahead = plan_ahead([5, 0], 4)  # refused by the planner on its thread
    with pytest.raises(zeppelin.InvalidArgument, match="sequence 1 has length 0"):
        ahead.wait()
    plan_ahead([100, 200], 4)  # dropped unwaited: its finalizer waits for it

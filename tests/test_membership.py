"""The supervisor's course as a state machine (supervisor/membership.py): the membership one
typed value its transitions make anew, and how a job ends a function of what is left of it."""

from __future__ import annotations

import pytest

from notebook_elastic.supervisor.membership import DELETED, Membership, Phase, ending


def test_each_transition_makes_a_new_membership_and_leaves_the_old_one_as_it_was():
    start = Membership(target=2, range=(1, 4), epoch=3)
    assert start.scaled(4) == Membership(4, (1, 4), 3) and start.target == 2
    with pytest.raises(ValueError) as refused:
        start.scaled(5)
    assert str(refused.value) == "cannot scale to 5 nodes: the job's range is 1:4; widen it with set_range(1, 5) first"
    # A new range: new agents in a new epoch, the target kept inside it.
    assert start.ranged(3, 6) == Membership(3, (3, 6), 4)
    assert start.ranged(1, 1) == Membership(1, (1, 1), 4)
    with pytest.raises(ValueError, match=r"range 3:2 is invalid: need 1 <= MIN <= MAX"):
        start.ranged(3, 2)
    assert start.lowered().lowered().lowered() == Membership(0, (1, 4), 3)
    # A resumed run goes on with the range and size it was left at; a damaged record changes nothing.
    assert start.resumed_at(1, 3, 3) == Membership(3, (1, 3), 3)
    assert start.resumed_at(2, 1, 3) is start


def test_preempted_capacity_comes_back_one_node_at_a_time_when_due_and_never_past_the_top():
    m = Membership(target=3, range=(1, 4)).returning(20.0).returning(10.0).returning(30.0)
    assert m.returns == (10.0, 20.0, 30.0) and m.waits_for_capacity
    assert m.returned(5.0) is None
    once = m.returned(25.0)
    assert once is not None and (once.target, once.returns) == (4, (20.0, 30.0))
    twice = once.returned(25.0)
    assert twice is not None and (twice.target, twice.returns) == (4, (30.0,))  # the range's top holds
    assert twice.returned(25.0) is None


def test_how_a_job_ends_is_decided_by_what_is_left_of_it_in_order():
    alive = dict(folder=None, files_changed=None, fatal=None, waits_for_capacity=False)
    assert ending(Phase.RUNNING, [0, 1], **alive) == ("succeeded", None)
    assert ending(Phase.STOPPING, [0, -15], **alive) == ("stopped", "stopped on request")
    assert ending(Phase.RUNNING, [3, -9], **alive) == ("failed", None)  # the caller says why
    assert ending(Phase.RUNNING, [-9], **{**alive, "waits_for_capacity": True}) is None  # it waits
    assert ending(Phase.STOPPING, [0], **{**alive, "fatal": "rank 0 ran out of memory"}) == (
        "failed",
        "rank 0 ran out of memory",
    )
    assert ending(Phase.RUNNING, [0], **{**alive, "files_changed": "script.py changed"}) == (
        "failed",
        "script.py changed",
    )
    assert ending(Phase.STOPPING, [0], **{**alive, "folder": DELETED, "fatal": "x"}) == ("lost", None)


def test_a_departure_regroups_the_survivors_without_a_joiner_still_starting():
    """The round's target (TARGET_KEY) the supervisor publishes: a round holding it closes at
    once. A scale-up's joiner still starting is waited for while the others train on; once a
    node goes meanwhile, the survivors stand still, and waited for it too (a Slurm joiner's
    start held a loss's survivors 5 s, an adversary's pass): they regroup once the round holds
    at least themselves ("1+"), the joiner comes in a change of its own. Where every worker
    restarts at each round (survivors=None), a round more is a restart more: the target."""
    from torch.distributed import TCPStore

    from notebook_elastic.agent.store_link import holds_target, target_nodes
    from notebook_elastic.supervisor.board import Board

    board = Board()
    board.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def closes_with(held: int) -> bool:
        return holds_target(held, target_nodes(board.store))

    board.publish_target(3, survivors=2)  # scaled 2 -> 3, the joiner's agent starting
    assert target_nodes(board.store) == (3, False) and not closes_with(2) and closes_with(3)
    board.round_formed("job", 0, 1)
    assert board.latest_round == (0, 1)
    board.regroup(2, survivors=1)  # a member killed while the joiner starts: lowered to 2, 1 survivor
    assert target_nodes(board.store) == (1, True) and closes_with(1) and closes_with(2) and not closes_with(0)
    board.publish_target(2, survivors=None)
    assert target_nodes(board.store) == (2, False) and not closes_with(1)
    board.publish_target(2, survivors=1)
    board.round_formed("job", 0, 1)  # an older round's event clears nothing
    board.publish_target(2, survivors=1)
    assert closes_with(1)
    board.round_formed("job", 0, 2)  # the survivors' round: the joiner's is a change at the target
    board.publish_target(2, survivors=1)
    assert target_nodes(board.store) == (2, False)
    board.regroup(2, survivors=0)  # no survivor: nothing to close a round with early
    assert target_nodes(board.store) == (2, False)

"""Ranks that disagree about who they are: the token-budget sampler, ``pack_rows``, a sampler built
for a trainer (as every ``install()`` builds it) and ``StepPlanner(dp_group=...)`` on 2 and 3
gloo ranks under a hard deadline, where one rank believes it is alone, every rank does, two
ranks claim one rank, a rank is out of range, or one rank flushes alone: the same ``ValueError``
on every rank, none hangs, no step is taken and the pool is unchanged; where they agree, every
sample is trained once per epoch. Then the pure functions that decide agreement from the
gathered facts, on facts drawn by hypothesis (a process per draw would be far too slow)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal.epochs.agreement import input_disagreement
from tests.deadline import run_with_deadline

dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

#: One world's whole run (spawn, torch import, every scenario); a healthy run takes seconds.
DEADLINE_S = 180.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def world(request, tmp_path_factory):
    size = request.param
    out = tmp_path_factory.mktemp(f"ranks{size}")
    script = (
        "import multiprocessing as mp, sys\n"
        "from tests.rank_agreement_workers import main\n"
        "if __name__ == '__main__':\n"
        f"    ps = [mp.get_context('spawn').Process(target=main, args=(r, {size}, {str(out / 'init')!r}, {str(out)!r})) "
        f"for r in range({size})]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
        "    sys.exit(max(p.exitcode for p in ps))\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = run_with_deadline([sys.executable, "-c", script], deadline_s=DEADLINE_S, cwd=ROOT, env=env,
                               what=f"{size} disagreeing ranks")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    for record in records:
        assert "crash" not in record, record["crash"]
    return size, records


def errors(records, scenario):
    outcomes = [record[scenario] for record in records]
    assert not any(o["ok"] for o in outcomes), f"{scenario}: a rank went on: {outcomes}"
    return [o["error"] for o in outcomes]


def test_a_rank_that_believes_it_is_alone_is_an_error_on_every_rank(world):
    size, records = world
    for scenario in ("alone_on_rank_0", "pack_alone_on_rank_0", "trainer_alone_on_rank_0"):
        for error in errors(records, scenario):
            assert "different settings" in error and f"num_replicas (from 1 to {size}" in error, (scenario, error)


def test_every_rank_alone_in_a_group_of_several_is_the_same_error(world):
    size, records = world
    messages = errors(records, "everyone_alone")
    assert len(set(messages)) == 1, messages
    assert f"num_replicas=1 on every rank, but its process group has {size} ranks" in messages[0]


def test_two_ranks_with_one_rank_is_the_same_error_naming_both(world):
    size, records = world
    messages = errors(records, "same_rank")
    assert len(set(messages)) == 1, messages
    assert "ranks 0 and 1 of the process group both pass rank=0; rank=1 is passed by none" in messages[0]


def test_a_rank_out_of_range_is_an_error_on_every_rank(world):
    size, records = world
    messages = errors(records, "out_of_range")
    assert f"rank must be an int in [0, {size})" in messages[-1] and f"got {size}" in messages[-1]
    for peer in messages[:-1]:
        assert f"rank {size - 1} of the process group failed" in peer


@pytest.mark.parametrize("scenario", ["numpy_ints", "defaults"])
def test_agreeing_ranks_train_every_sample_once_per_epoch(world, scenario):
    size, records = world
    outcomes = [record[scenario] for record in records]
    assert all(o["ok"] for o in outcomes), outcomes
    assert sorted(o["value"]["rank"] for o in outcomes) == list(range(size))
    assert len({o["value"]["len"] for o in outcomes}) == 1
    for epoch in range(3):
        trained = sorted(i for o in outcomes for mb in o["value"]["mine"][epoch] for i in mb)
        assert trained == list(range(90)), f"epoch {epoch}: trained twice or never"
    rows = [record["pack_agreed"] for record in records]
    assert all(r["ok"] for r in rows) and all(r["value"] == rows[0]["value"] for r in rows)
    # num_replicas=1 on every rank packs once for the whole group (rows shared out afterwards)
    once = [record["pack_once_for_the_group"] for record in records]
    assert all(r["ok"] for r in once) and all(r["value"] == once[0]["value"] for r in once), once
    assert len(once[0]["value"]) == 1 and sorted(i for row in once[0]["value"][0] for i in row) == list(range(90))


def test_a_flush_on_one_rank_alone_is_an_error_on_every_rank_before_any_step(world):
    size, records = world
    runs = [record["planner_flush_on_rank_0"] for record in records]
    first = [run["errors"][0] for run in runs]
    assert len(set(first)) == 1 and "rank 0 has flush=True, rank 1 has False" in first[0], first
    for run in runs:
        assert run["steps"][0] == "error" and run["unchanged"], "a rank took the step, or its pool changed"
        assert run["pending"][0] == 0  # that step's arrivals were refused on every rank
        assert len(run["errors"]) == 1 and run["steps"][1:] == runs[0]["steps"][1:]
    taken = sorted(i for step in runs[0]["steps"][1:] if step is not None for rank in step for mb in rank for i in mb)
    expected = sorted(((s * 10 + r) * 100) + j for s in (1, 2) for r in range(size) for j in range(4))
    assert taken == expected, "the later steps lost or duplicated a sample"
    for step in runs[0]["steps"][1:]:  # groups given as a tensor ([1, 1, 2, 2]) stay whole
        where = {i: (r, m) for r, rank in enumerate(step) for m, mb in enumerate(rank) for i in mb}
        for first in (i for i in where if i % 2 == 0):
            assert where[first] == where[first + 1], f"group of {first} and {first + 1} split"


@pytest.mark.parametrize("scenario, expected", [
    ("planner_alone_on_rank_0", "rank 0 has num_replicas=1, rank 1 has {size}"),
    ("planner_everyone_alone", "num_replicas=1 on every rank, but dp_group has {size} ranks"),
])
def test_a_planner_whose_num_replicas_is_not_the_groups_size_is_an_error_on_every_rank(world, scenario, expected):
    size, records = world
    runs = [record[scenario] for record in records]
    for run in runs:
        assert run["steps"] == ["error"] * 3, run["steps"]
        assert expected.format(size=size) in run["errors"][0]
    assert len({run["errors"][0] for run in runs}) == 1


# --- the decision from gathered facts, drawn -----------------------------------------------------

NAMES = ("max_token_len", "seed", "num_replicas")


@st.composite
def rank_facts(draw):
    """Every rank's settings and claimed rank: mostly agreeing, sometimes not, in one way or
    several."""
    world = draw(st.integers(1, 6))
    base = {"max_token_len": draw(st.integers(1, 9)), "seed": draw(st.integers(0, 3)),
            "num_replicas": world if draw(st.integers(0, 3)) else draw(st.integers(1, 7))}
    facts = []
    for _ in range(world):
        mine = dict(base)
        if draw(st.integers(0, 4)) == 0:
            name = draw(st.sampled_from(NAMES))
            mine[name] = draw(st.integers(1, 7))
        facts.append(mine)
    claimed = list(range(world))
    if draw(st.booleans()):
        claimed = draw(st.permutations(claimed))
    if world > 1 and draw(st.integers(0, 2)) == 0:
        a, b = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=2, unique=True))
        claimed[b] = claimed[a]
    return world, facts, claimed


@settings(max_examples=500, deadline=None)
@given(rank_facts())
def test_the_agreement_verdict_from_gathered_facts(case):
    world, facts, claimed = case
    ranges = [(min(f[n] for f in facts), max(f[n] for f in facts)) for n in NAMES]
    verdicts = [input_disagreement([(n, f[n]) for n in NAMES], ranges, world, f["num_replicas"], claimed,
                                   who="sampler") for f in facts]
    assert all((v is None) == (verdicts[0] is None) for v in verdicts), "the ranks reached different verdicts"
    differing = [n for n, (low, high) in zip(NAMES, ranges) if low != high]
    replicas = facts[0]["num_replicas"]
    if differing:
        for verdict in verdicts:
            assert "different settings" in verdict and all(f"{n} (from" in verdict for n in differing)
        return
    assert len(set(verdicts)) == 1, "an agreed error that is not the same on every rank"
    verdict = verdicts[0]
    if replicas != world:
        assert f"num_replicas={replicas} on every rank, but its process group has {world} ranks" in verdict
    elif sorted(claimed) != list(range(world)):
        second = next(i for i, r in enumerate(claimed) if r in claimed[:i])
        first = claimed.index(claimed[second])
        missing = min(set(range(world)) - set(claimed))
        assert (f"ranks {first} and {second} of the process group both pass rank={claimed[second]}; "
                f"rank={missing} is passed by none") in verdict
    else:
        # agreed: every rank is a distinct replica of the same plan, so each sample is trained once
        assert verdict is None


@st.composite
def planner_facts(draw):
    world = draw(st.integers(1, 5))
    names = ["num_replicas", "micro_batches_per_step", "steps taken", "samples pending", "flush"]
    base = [world if draw(st.integers(0, 3)) else draw(st.integers(1, 6)), draw(st.integers(1, 3)),
            draw(st.integers(0, 4)), draw(st.integers(0, 9)), draw(st.booleans())]
    facts = []
    for _ in range(world):
        mine = list(base)
        change = draw(st.integers(0, 6))
        if change < len(names):
            position = change
            if names[position] == "flush":
                mine[position] = draw(st.sampled_from([not base[position], "flush must be True or False, got 'x'"]))
            else:
                mine[position] = draw(st.integers(0, 6))
        facts.append(mine)
    return world, names, facts


@settings(max_examples=500, deadline=None)
@given(planner_facts())
def test_the_step_verdict_from_gathered_facts(case):
    from seqbal.stream.planner import steps_disagreement

    world, names, facts = case
    verdict = steps_disagreement(facts, names)
    flushes = [f[-1] for f in facts]
    bad = [r for r, f in enumerate(flushes) if not isinstance(f, bool)]
    if bad:
        assert f"rank {bad[0]} of dp_group passed an invalid flush" in verdict
    elif any(f != facts[0] for f in facts):
        rank = next(r for r, f in enumerate(facts) if f != facts[0])
        name = next(n for n, a, b in zip(names, facts[0], facts[rank]) if a != b)
        assert f"the ranks of dp_group disagree: rank 0 has {name}=" in verdict and f"rank {rank} has" in verdict
        assert "no rank took a step" in verdict
    elif facts[0][0] != world:
        assert f"num_replicas={facts[0][0]} on every rank, but dp_group has {world} ranks" in verdict
    else:
        assert verdict is None, "agreeing ranks refused a step"
    if verdict is None:  # a step is taken only where every rank flushes alike
        assert len(set(flushes)) == 1


def test_first_disagreement_names_the_first_rank_and_fact():
    from seqbal.collectives import first_disagreement

    assert first_disagreement([[1, True], [1, True], [2, False]], ["a", "flush"]) == ("a", 1, 2, 2)
    assert first_disagreement([[1, True]] * 3, ["a", "flush"]) is None

"""A planted bug in a user's fault-tolerant loop is found by random plans and replayed from its seed.

The loop is the shrink-and-redo SGD of ``examples/elastic_sgd.py``, in the
await API: on ``PeerLostError`` the survivors shrink, agree on the step to
redo and redo it. This one updates each parameter as soon as its gradient is
reduced, so a rank lost between the two reductions of a step leaves the
first parameter updated: redoing the step without restoring the parameters
saved before it updates that one twice. The correct loop restores them.

Every run is checked against plain SGD on one process, which the loop must
match whatever rank dies when (the update divides the all-reduced sum of
the batch's gradients by the batch size, whatever the group's size).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from asyncdist.errors import PeerLostError
from asyncdist.reduce.op import ReduceOp
from asyncdist.testing import local_world
from asyncdist.testing.faults import FaultPlan
from asyncdist.testing.injector import RankKilled

STEPS, BATCH, LR, WORLD = 4, 12, 0.1, 3
SEEDS = range(12)
_data = np.random.default_rng(1234)
FEATURES = _data.normal(size=(64, 4))
TARGETS = FEATURES @ np.array([1.0, -2.0, 0.5, 3.0])
START = [np.zeros(2), np.zeros(2)]  # the model's two parameters: weights of features 0-1 and 2-3


def batch(step: int) -> np.ndarray:
    return np.random.default_rng(step).permutation(len(FEATURES))[:BATCH]


def gradients(params: list[np.ndarray], samples: np.ndarray) -> list[np.ndarray]:
    """The summed squared-error gradients of ``samples`` for each parameter."""
    x, y = FEATURES[samples], TARGETS[samples]
    error = x[:, :2] @ params[0] + x[:, 2:] @ params[1] - y
    return [x[:, :2].T @ error, x[:, 2:].T @ error]


def reference() -> list[np.ndarray]:
    params = [p.copy() for p in START]
    for step in range(STEPS):
        for p, grad in zip(params, gradients(params, batch(step))):
            p -= LR * grad / BATCH
    return params


async def train(g: Any, restore: bool) -> tuple[list[np.ndarray], Any]:
    """The user's loop; ``restore=False`` is the planted bug."""
    params = [p.copy() for p in START]
    step = 0
    while step < STEPS:
        saved = [p.copy() for p in params]
        try:
            grads = gradients(params, batch(step)[g.rank::g.size])
            for p, grad in zip(params, grads):  # each parameter is updated as soon as its gradient is reduced
                await g.all_reduce(grad)
                p -= LR * grad / BATCH
            step += 1
        except PeerLostError:
            g = await g.shrink()
            redo = np.array([step])
            await g.all_reduce(redo, op=ReduceOp.MIN)  # the earliest step that failed anywhere
            step = int(redo[0])
            if restore:
                params = saved
    return params, g


async def run(plan: FaultPlan, restore: bool) -> list[np.ndarray]:
    """Train under ``plan``; rank 0's final parameters (the plan spares rank 0).

    Raises AssertionError (noted with the plan by ``local_world``) if a survivor's
    parameters differ from plain SGD's."""
    async with local_world(WORLD, faults=plan) as worlds:
        outcomes = await asyncio.gather(*(train(w, restore) for w in worlds), return_exceptions=True)
        finals = [o for o in outcomes if not isinstance(o, BaseException)]
        try:
            assert [type(o) for o in outcomes if isinstance(o, BaseException)] == [RankKilled] * len(plan.kills)
            expected = reference()
            for params, _ in finals:
                assert all(np.allclose(p, e, rtol=1e-12, atol=1e-12) for p, e in zip(params, expected)), (
                    f"parameters {params} differ from plain SGD's {expected}")
        finally:
            await asyncio.gather(*(g.close() for _, g in finals))
    return finals[0][0]


def random_plan(seed: int) -> FaultPlan:
    return FaultPlan.random(seed, WORLD, ["kill"], ops=["all_reduce"], max_count=2 * STEPS)


async def failure(plan: FaultPlan, restore: bool) -> str | None:
    try:
        await run(plan, restore)
    except AssertionError as exc:
        return "\n".join([str(exc).splitlines()[0], *getattr(exc, "__notes__", [])])  # the message, the plan
    return None


async def test_the_planted_bug_is_found_by_a_random_plan_and_replayed_from_its_seed() -> None:
    buggy = {seed: await failure(random_plan(seed), restore=False) for seed in SEEDS}
    found = {seed: text for seed, text in buggy.items() if text is not None}
    assert found, "no random plan found the planted bug"
    seed, text = min(found.items())
    plan = random_plan(seed)
    assert f"fault plan: {plan}" in text and f"seed {seed}; kill" in text  # the failure names the plan and seed
    # The same seed draws the same plan, which fails the same way: the same parameters, to the bit.
    assert random_plan(seed) == FaultPlan.parse(str(plan)) == plan
    assert await failure(FaultPlan.parse(str(plan)), restore=False) == text
    # The plans that did not find it killed nobody between a step's two reductions.
    for quiet in set(SEEDS) - set(found):
        (kill,) = random_plan(quiet).faults
        assert kill.at.count % 2 == 1, random_plan(quiet)
    assert all(random_plan(s).faults[0].at.count % 2 == 0 for s in found)


async def test_the_correct_loop_passes_every_random_plan() -> None:
    expected = reference()
    for seed in SEEDS:
        params = await run(random_plan(seed), restore=True)
        assert all(np.allclose(p, e, rtol=1e-12, atol=1e-12) for p, e in zip(params, expected))

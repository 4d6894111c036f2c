"""A device call's arguments by name (group/devices.py ``_arguments``), against
``inspect.Signature.bind`` with defaults applied: every collective, every split
of its parameters into positional and keyword ones, with a parameter too many,
an unknown keyword, a parameter given twice and required ones missing."""

from __future__ import annotations

import inspect
import itertools

import pytest

from asyncdist.group.collectives import Collectives
from asyncdist.group.devices import _arguments

NAMES = [name for name, _ in inspect.getmembers(Collectives, inspect.iscoroutinefunction) if not name.startswith("_")]


def _bound(method, args: tuple, kwargs: dict) -> dict | type[TypeError]:
    try:
        bound = inspect.signature(method).bind(None, *args, **kwargs)
    except TypeError:
        return TypeError
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != "self"}


@pytest.mark.parametrize("name", NAMES)
def test_arguments_match_inspect_bind(name: str) -> None:
    method = getattr(Collectives, name)
    params = list(inspect.signature(method).parameters)[1:]
    for positional in range(len(params) + 2):
        args = tuple(f"arg {p}" for p in params[:positional]) + ("one too many",) * (positional > len(params))
        for keywords in itertools.chain.from_iterable(
            itertools.combinations([*params, "unknown"], k) for k in range(len(params) + 2)
        ):
            kwargs = {k: f"keyword {k}" for k in keywords}
            try:
                got: dict | type[TypeError] = _arguments(method, args, kwargs)
            except TypeError:
                got = TypeError
            assert got == _bound(method, args, kwargs), (args, kwargs)

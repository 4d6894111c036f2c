"""Tests for asyncdist.engine.matching: the Matcher against a plain list-based model
of the MPI matching rules, fed random interleavings of receives posted,
messages arriving, receives withdrawn and peers lost (no loop, no socket).

Both sides are driven the way the engine drives the Matcher: a new receive
first takes the earliest fitting unexpected message, and is posted only if
there is none; an arriving message first takes the earliest fitting posted
receive, and is queued as unexpected only if there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdist.buffers.host import HostBuffer
from asyncdist.engine.matching import Inbound, Matcher, PostedRecv
from asyncdist.wire.frames import Header, Kind

RANKS = (0, 1, 2)


def recv(label: object, ctx: int, src: int | None, tag: int, sources: frozenset[int] = frozenset()) -> PostedRecv:
    """A PostedRecv whose ``future`` slot carries a label, for telling receives apart."""
    return PostedRecv(ctx, src, tag, HostBuffer(memoryview(bytearray(0)), "uint8", (0,)), label, frozenset(sources))


def message(label: object, ctx: int, src: int, tag: int) -> Inbound:
    """An Inbound whose ``data`` slot carries a label."""
    return Inbound(Header(Kind.DATA, ctx, src, tag, 0, "uint8", (0,), 0), data=label)


# -- the reference model -----------------------------------------------------------


@dataclass
class Msg:
    label: int
    ctx: int
    src: int
    tag: int


@dataclass
class Recv:
    label: int
    ctx: int
    src: int | None
    tag: int
    sources: frozenset[int]


def fits(r: Recv, m: Msg) -> bool:
    return r.ctx == m.ctx and r.tag == m.tag and (r.src is None or r.src == m.src)


class Model:
    """The MPI rules, as plainly as they can be written: two lists in time order."""

    def __init__(self) -> None:
        self.posted: list[Recv] = []  # in posting order
        self.unexpected: list[Msg] = []  # in arrival order

    def post(self, r: Recv) -> int | None:
        for m in self.unexpected:
            if fits(r, m):
                self.unexpected.remove(m)
                return m.label
        self.posted.append(r)
        return None

    def arrive(self, m: Msg) -> int | None:
        for r in self.posted:
            if fits(r, m):
                self.posted.remove(r)
                return r.label
        self.unexpected.append(m)
        return None

    def unpost(self, label: int) -> bool:
        for r in self.posted:
            if r.label == label:
                self.posted.remove(r)
                return True
        return False

    def lose(self, rank: int) -> set[int]:
        # A receive depends on its named sender and on every rank in its
        # sources (any-source candidates, or a collective's other members).
        taken = [r for r in self.posted if r.src == rank or rank in r.sources]
        self.posted = [r for r in self.posted if r not in taken]
        return {r.label for r in taken}

    def stale(self, ctx: int, below: int) -> int | None:
        # The earliest message of the lowest tag below ``below`` in ``ctx``.
        old = [m for m in self.unexpected if m.ctx == ctx and m.tag < below]
        if not old:
            return None
        taken = next(m for m in old if m.tag == min(o.tag for o in old))
        self.unexpected.remove(taken)
        return taken.label


# -- the Matcher, driven as the engine drives it ----------------------------------------


class Driven:
    def __init__(self) -> None:
        self.matcher = Matcher()
        self.recvs: dict[int, PostedRecv] = {}

    def post(self, r: Recv) -> int | None:
        inbound = self.matcher.take_unexpected(r.ctx, r.src, r.tag)
        if inbound is not None:
            return inbound.data
        posted = self.recvs[r.label] = recv(r.label, r.ctx, r.src, r.tag, r.sources)
        self.matcher.post(posted)
        return None

    def arrive(self, m: Msg) -> int | None:
        inbound = message(m.label, m.ctx, m.src, m.tag)
        posted = self.matcher.take_posted(inbound.header)
        if posted is not None:
            return posted.future
        self.matcher.add_unexpected(inbound)
        return None

    def unpost(self, label: int) -> bool:
        if label not in self.recvs:  # matched at once, never posted: still try a twin
            return self.matcher.unpost(recv(label, 0, None, 0))
        return self.matcher.unpost(self.recvs[label])

    def lose(self, rank: int) -> set[int]:
        taken = self.matcher.take_dependents(rank)
        labels = [r.future for r in taken]
        assert len(labels) == len(set(labels)), "a receive was returned twice"
        return set(labels)

    def stale(self, ctx: int, below: int) -> int | None:
        inbound = self.matcher.take_stale(ctx, below)
        return None if inbound is None else inbound.data


ctxs, tags = st.integers(0, 1), st.integers(0, 3)
events = st.one_of(
    st.tuples(st.just("stale"), ctxs, st.integers(0, 4)),
    st.tuples(st.just("post"), st.sampled_from([*RANKS, None]), tags, ctxs, st.frozensets(st.sampled_from(RANKS))),
    st.tuples(st.just("arrive"), st.sampled_from(RANKS), tags, ctxs),
    st.tuples(st.just("unpost"), st.integers(0, 60)),
    st.tuples(st.just("lose"), st.sampled_from(RANKS)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, max_size=60))
def test_matcher_agrees_with_the_mpi_model(script: list[tuple]) -> None:
    model, driven = Model(), Driven()
    for label, event in enumerate(script):
        kind = event[0]
        if kind == "post":
            _, src, tag, ctx, sources = event
            r = Recv(label, ctx, src, tag, sources)
            assert driven.post(r) == model.post(r), (label, event)
        elif kind == "arrive":
            _, src, tag, ctx = event
            m = Msg(label, ctx, src, tag)
            assert driven.arrive(m) == model.arrive(m), (label, event)
        elif kind == "unpost":
            assert driven.unpost(event[1]) == model.unpost(event[1]), (label, event)
        elif kind == "stale":
            assert driven.stale(event[1], event[2]) == model.stale(event[1], event[2]), (label, event)
        else:
            assert driven.lose(event[1]) == model.lose(event[1]), (label, event)
        assert driven.matcher.pending_counts() == (len(model.posted), len(model.unexpected))
    # What is left posted is what the model has left, in posting order.
    assert [r.future for r in sorted(driven.matcher.take_all(), key=lambda r: r.order)] == [
        r.label for r in model.posted
    ]
    assert driven.matcher.pending_counts() == (0, len(model.unexpected))


# -- the rules, by example ---------------------------------------------------------------


def test_arrival_takes_earliest_posted_of_exact_and_any_source() -> None:
    matcher = Matcher()
    any_first, exact = recv("any", 0, None, 5), recv("exact", 0, 1, 5)
    matcher.post(any_first)
    matcher.post(exact)
    assert matcher.take_posted(message("m1", 0, 1, 5).header) is any_first
    assert matcher.take_posted(message("m2", 0, 1, 5).header) is exact
    assert matcher.take_posted(message("m3", 0, 1, 5).header) is None


def test_exact_posted_before_any_source_wins() -> None:
    matcher = Matcher()
    exact, any_later = recv("exact", 0, 2, 5), recv("any", 0, None, 5)
    matcher.post(exact)
    matcher.post(any_later)
    assert matcher.take_posted(message("m", 0, 2, 5).header) is exact
    # A message from another source skips the exact receive and takes the any-source one.
    matcher.post(exact)
    assert matcher.take_posted(message("m", 0, 0, 5).header) is any_later


def test_any_source_receive_takes_earliest_arrival_across_sources() -> None:
    matcher = Matcher()
    arrivals = [message(f"m{i}", 0, src, 3) for i, src in enumerate([2, 0, 2, 1])]
    for m in arrivals:
        matcher.add_unexpected(m)
    assert [matcher.take_unexpected(0, None, 3) for _ in range(4)] == arrivals
    assert matcher.take_unexpected(0, None, 3) is None
    assert matcher.pending_counts() == (0, 0)


def test_contexts_and_tags_never_cross() -> None:
    matcher = Matcher()
    matcher.add_unexpected(message("m", 1, 0, 7))
    assert matcher.take_unexpected(0, 0, 7) is None
    assert matcher.take_unexpected(1, 0, 8) is None
    assert matcher.take_unexpected(1, None, 6) is None
    assert matcher.take_unexpected(1, 1, 7) is None
    assert matcher.take_unexpected(1, None, 7).data == "m"


def test_unpost() -> None:
    matcher = Matcher()
    a, b, c = recv("a", 0, 1, 0), recv("b", 0, 1, 0), recv("c", 0, None, 0)
    for r in (a, b, c):
        matcher.post(r)
    assert matcher.unpost(a) is True
    assert matcher.unpost(a) is False
    assert matcher.unpost(recv("a", 0, 1, 0)) is False  # an equal-looking twin is another receive
    assert matcher.unpost(c) is True
    assert matcher.pending_counts() == (1, 0)
    assert matcher.take_posted(message("m", 0, 1, 0).header) is b
    assert matcher.unpost(b) is False  # already matched
    assert matcher.pending_counts() == (0, 0)


def test_take_dependents() -> None:
    matcher = Matcher()
    from_1 = recv("from 1", 0, 1, 0)
    from_1_other_ctx = recv("from 1, ctx 1", 1, 1, 4)
    from_2 = recv("from 2", 0, 2, 0)
    any_with_1 = recv("any of {0,1}", 0, None, 0, frozenset({0, 1}))
    any_without_1 = recv("any of {0,2}", 0, None, 0, frozenset({0, 2}))
    any_no_sources = recv("any of {}", 1, None, 0)
    for r in (from_1, from_2, any_with_1, any_without_1, from_1_other_ctx, any_no_sources):
        matcher.post(r)
    taken = matcher.take_dependents(1)
    assert sorted(r.future for r in taken) == sorted(["from 1", "from 1, ctx 1", "any of {0,1}"])
    assert matcher.pending_counts() == (3, 0)
    assert matcher.take_dependents(1) == []
    # The others are still posted, in order: a message from 0 takes the any-source
    # receive whose sources are {0, 2}; one from 2 takes the exact receive.
    assert matcher.take_posted(message("m", 0, 0, 0).header) is any_without_1
    assert matcher.take_posted(message("m", 0, 2, 0).header) is from_2
    assert matcher.take_posted(message("m", 1, 5, 0).header) is any_no_sources
    assert matcher.pending_counts() == (0, 0)


def test_take_dependents_leaves_unexpected_messages() -> None:
    matcher = Matcher()
    matcher.add_unexpected(message("m", 0, 1, 0))
    matcher.post(recv("r", 0, 1, 1))
    assert [r.future for r in matcher.take_dependents(1)] == ["r"]
    assert matcher.pending_counts() == (0, 1)
    assert matcher.take_unexpected(0, 1, 0).data == "m"


def test_take_all_and_pending_counts() -> None:
    matcher = Matcher()
    assert matcher.pending_counts() == (0, 0)
    posted = [recv(i, i % 2, [0, None, 2][i % 3], i % 2) for i in range(6)]
    for r in posted:
        matcher.post(r)
    for i in range(3):
        matcher.add_unexpected(message(f"m{i}", 5, i, 9))  # fits none of the receives
    assert matcher.pending_counts() == (6, 3)
    taken = matcher.take_all()
    assert sorted(r.future for r in taken) == list(range(6))
    assert all(any(t is r for t in taken) for r in posted)
    assert matcher.pending_counts() == (0, 3)
    assert matcher.take_all() == []
    assert matcher.take_posted(message("m", 0, 0, 0).header) is None

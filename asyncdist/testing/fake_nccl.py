"""A fake ``cupy.cuda.nccl`` over fake devices: NCCL's semantics, NumPy's arithmetic.

The same module surface asyncdist uses from CuPy (``NcclCommunicator``,
``get_unique_id``, ``get_version``, ``groupStart``/``groupEnd``, the
``NCCL_*`` constants), acting on :mod:`.fake_cuda` pointers and streams,
so the NCCL path's mapping of every op is tested on a CPU with real ranks.

It keeps NCCL's rules, so mistakes show: an op is queued on its stream and
runs only when every rank's matching op has reached the head of its own
stream (work queued before it on any rank runs first); collectives match by
their order on the communicator, sends and receives by their order between
each pair of ranks (to self included); ops between ``groupStart`` and
``groupEnd`` are queued as one, which is what lets a rank send and receive
in one step without deadlock; sizes that disagree raise. ``VERSION`` may be
lowered to take the paths for older NCCL (no ``ncclAvg`` before 2.10).
Reductions of dtypes NumPy lacks (bfloat16) are not faked.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from .fake_cuda import FakeStream, resolve, step

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9

#: The NCCL version the fake claims (NCCL's encoding: 2.20.5 -> 22005).
VERSION = 22005

_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64}
_UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum, NCCL_AVG: np.add}


def get_version() -> int:
    return VERSION


def get_unique_id() -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in os.urandom(128))


class _Clique:
    def __init__(self, size: int) -> None:
        self.size = size
        self.members: dict[int, NcclCommunicator] = {}
        self.joined = threading.Condition()
        self.colls: defaultdict[int, dict[int, _Element]] = defaultdict(dict)
        self.p2p: defaultdict[tuple, dict[str, _Element]] = defaultdict(dict)

    def partners(self, el: _Element) -> list[_Element] | None:
        if el.key[0] == "coll":
            table = self.colls[el.key[1]]
            return [table[r] for r in range(self.size)] if len(table) == self.size else None
        pair = self.p2p[el.key]
        return [pair["send"], pair["recv"]] if len(pair) == 2 else None


_CLIQUES: dict[tuple[int, ...], _Clique] = {}
_CLIQUES_LOCK = threading.Lock()
_GROUP = threading.local()  # NCCL's group state is per thread


class _Element:
    __slots__ = ("kind", "fields", "key", "op", "done")

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self.kind, self.fields = kind, fields
        self.key: tuple = ()
        self.op: _Op | None = None
        self.done = False

    def array(self, which: str, count: int | None = None) -> np.ndarray:
        f = self.fields
        dtype = np.dtype(_DTYPES[f["dtype"]])
        n = f["count"] if count is None else count
        return resolve(f[which], n * dtype.itemsize).view(dtype)


class _Op:
    """One queued NCCL launch (a whole group call) on one stream."""

    def __init__(self, stream: FakeStream, elements: list[_Element], clique: _Clique) -> None:
        self.stream, self.elements, self.clique = stream, elements, clique
        for el in elements:
            el.op = self

    def advance(self, visiting: frozenset) -> str:
        progressed = False
        for el in self.elements:
            if el.done:
                continue
            partners = self.clique.partners(el)
            if partners is None:
                continue  # a rank has not issued its side yet
            ready = True
            for p in partners:
                assert p.op is not None, "a partner issued inside a group call not yet launched"
                s = p.op.stream
                if not (s.ops and s.ops[0][1] is p.op):
                    ready = False
                    if s not in visiting and step(s, visiting):
                        progressed = True
            if ready:
                _execute(el, partners)
                for p in partners:
                    p.done = True
                progressed = True
        if all(el.done for el in self.elements):
            return "done"
        return "progress" if progressed else "stuck"


def _execute(el: _Element, partners: list[_Element]) -> None:
    if el.key[0] == "p2p":
        send, recv = partners
        n_send = send.fields["count"] * np.dtype(_DTYPES[send.fields["dtype"]]).itemsize
        n_recv = recv.fields["count"] * np.dtype(_DTYPES[recv.fields["dtype"]]).itemsize
        if n_send != n_recv:
            raise RuntimeError(f"fake NCCL: a send of {n_send} bytes matched a receive of {n_recv} bytes")
        resolve(recv.fields["buf"], n_recv)[...] = resolve(send.fields["buf"], n_send)
        return
    kinds = {(p.kind, p.fields["count"], p.fields["dtype"], p.fields.get("op"), p.fields.get("root")) for p in partners}
    if len(kinds) != 1:
        raise RuntimeError(f"fake NCCL: ranks issued different collectives: {sorted(map(str, kinds))}")
    kind, f, n = el.kind, el.fields, len(partners)
    inputs = [p.array("send", f["count"] * (n if kind == "reduceScatter" else 1)).copy() for p in partners]
    if kind == "broadcast":
        for p in partners:
            p.array("recv")[...] = inputs[f["root"]]
    elif kind == "allGather":
        for p in partners:
            p.array("recv", f["count"] * n)[...] = np.concatenate(inputs)
    else:
        total = _UFUNCS[f["op"]].reduce(np.stack(inputs), axis=0)
        if f["op"] == NCCL_AVG:
            total = total / n
        total = total.astype(inputs[0].dtype)
        if kind == "allReduce":
            for p in partners:
                p.array("recv")[...] = total
        elif kind == "reduce":
            partners[f["root"]].array("recv")[...] = total
        else:  # reduceScatter
            for r, p in enumerate(partners):
                p.array("recv")[...] = total[r * f["count"] : (r + 1) * f["count"]]


def groupStart() -> None:  # noqa: N802 (CuPy's name)
    _GROUP.depth = getattr(_GROUP, "depth", 0) + 1
    if _GROUP.depth == 1:
        _GROUP.pending = []


def groupEnd() -> None:  # noqa: N802
    _GROUP.depth -= 1
    if _GROUP.depth:
        return
    launches: dict[tuple[int, int], list[_Element]] = {}
    comms: dict[tuple[int, int], NcclCommunicator] = {}
    for comm, stream, el in _GROUP.pending:
        launches.setdefault((id(comm), stream), []).append(el)
        comms[(id(comm), stream)] = comm
    for key, elements in launches.items():
        comms[key]._launch(elements, key[1])


class NcclCommunicator:
    """``cupy.cuda.nccl.NcclCommunicator(ndev, commId, rank)`` over fake devices."""

    def __init__(self, ndev: int, commId: tuple, rank: int) -> None:  # noqa: N803
        with _CLIQUES_LOCK:
            clique = _CLIQUES.setdefault(tuple(commId), _Clique(ndev))
        with clique.joined:
            clique.members[rank] = self
            clique.joined.notify_all()
            if not clique.joined.wait_for(lambda: len(clique.members) == ndev, timeout=60):
                raise RuntimeError("fake NCCL: not every rank joined the communicator")
        self._clique, self._rank, self._size = clique, rank, ndev
        self._colls = 0
        self._sent: defaultdict[int, int] = defaultdict(int)
        self._received: defaultdict[int, int] = defaultdict(int)
        self.aborted = False

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def device_id(self) -> int:
        return 0

    def _issue(self, kind: str, stream: int, **fields: Any) -> None:
        if self.aborted:
            raise RuntimeError("fake NCCL: communicator aborted")
        el = _Element(kind, fields)
        c = self._clique
        if kind == "send":
            el.key = ("p2p", self._rank, fields["peer"], self._sent[fields["peer"]])
            self._sent[fields["peer"]] += 1
            c.p2p[el.key]["send"] = el
        elif kind == "recv":
            el.key = ("p2p", fields["peer"], self._rank, self._received[fields["peer"]])
            self._received[fields["peer"]] += 1
            c.p2p[el.key]["recv"] = el
        else:
            el.key = ("coll", self._colls)
            self._colls += 1
            c.colls[el.key[1]][self._rank] = el
        if getattr(_GROUP, "depth", 0):
            _GROUP.pending.append((self, stream, el))
        else:
            self._launch([el], stream)

    def _launch(self, elements: list[_Element], stream: int) -> None:
        s = FakeStream.from_handle(stream)
        s.ops.append(("rendezvous", _Op(s, elements, self._clique)))

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:  # noqa: N802
        self._issue("allReduce", stream, send=sendbuf, recv=recvbuf, count=count, dtype=datatype, op=op)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int, stream: int) -> None:
        self._issue("reduce", stream, send=sendbuf, recv=recvbuf, count=count, dtype=datatype, op=op, root=root)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._issue("broadcast", stream, send=sendbuff, recv=recvbuff, count=count, dtype=datatype, root=root)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int, stream: int) -> None:  # noqa: N802
        self._issue("reduceScatter", stream, send=sendbuf, recv=recvbuf, count=recvcount, dtype=datatype, op=op)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:  # noqa: N802
        self._issue("allGather", stream, send=sendbuf, recv=recvbuf, count=count, dtype=datatype)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._issue("send", stream, buf=sendbuf, count=count, dtype=datatype, peer=peer)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._issue("recv", stream, buf=recvbuf, count=count, dtype=datatype, peer=peer)

    def check_async_error(self) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True

    def destroy(self) -> None:
        self.aborted = True

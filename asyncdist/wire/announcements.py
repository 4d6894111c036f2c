"""The announcement of a rooted collective call, as a typed value (sans-I/O).

A rank that opens a broadcast, reduce, gather or scatter tells the root it
names (or, as the root, every other member) which call it makes, so that
ranks that name different roots all fail instead of diverging in silence
(:mod:`asyncdist.group.calls` says how). An announcement travels as a
zero-byte DATA message of the group's announcement context, whose tag and
call number are the call's number and whose description is the call's text;
only this module knows that layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProtocolError
from .frames import Header, Kind

__all__ = ["Announcement"]


@dataclass(frozen=True, slots=True)
class Announcement:
    """Rank ``src`` makes call ``call`` of the group whose announcement context is ``ctx``.

    Attributes:
        src: the announcing rank (global).
        ctx: the group's announcement context.
        call: the call's number in its group.
        description: the call's description as its messages carry it, root
            included ("broadcast(src=1, float32[4])").
    """

    src: int
    ctx: int
    call: int
    description: str

    def header(self) -> Header:
        """The header to send (no payload)."""
        return Header(Kind.DATA, self.ctx, self.src, self.call, self.call, "uint8", (0,), 0, self.description)

    @classmethod
    def of(cls, header: Header) -> Announcement:
        """The announcement a received header carries.

        Raises:
            ProtocolError: the header is not an announcement (a payload, or
                a tag that differs from its call number).
        """
        if header.kind != Kind.DATA or header.nbytes or header.tag != header.seq:
            raise ProtocolError(f"rank {header.src} sent a malformed announcement: {header}")
        return cls(header.src, header.ctx, header.tag, header.op)

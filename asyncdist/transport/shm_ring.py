"""A one-way byte ring in memory that two processes on one host share.

Over loopback TCP every small message costs a system call to send and a
wake-up of the receiver through the kernel (the *socket floor*, tens of
microseconds under an event loop). Between ranks on one host a frame can
instead be copied once into memory the receiver maps too, and picked up by
a receiver that is already looking, with no system call at either end. MPI
libraries do the same for their eager messages.

A :class:`ShmRing` is a single-producer, single-consumer ring of bytes: one
rank writes frames into it, its peer reads them out, in order, exactly as
they would have come off the socket (the same
:class:`~asyncdist.wire.frames.FrameDecoder` parses them). The memory is an
anonymous ``memfd`` of the reader's, which the writer opens through
``/proc/<pid>/fd/<fd>``: nothing is left in ``/dev/shm`` when a process
dies, and only a process allowed to read the reader's descriptors (the same
user, the same PID namespace) can open it. A random nonce written in the
ring and sent over the authenticated stream proves that the writer opened
the right memory, so peers on other hosts fail the check and keep TCP.

Layout: a page of control words, then ``capacity`` bytes of data (a power
of two). The reader alone writes the words of the first cache line, the
writer alone those of the second; each side keeps its own count of bytes
(``head``, ``tail``) and publishes it after copying, so a word is never
written by both:

* ``head``: bytes read so far; ``polling``: 1 while the reader looks at
  the ring without being told to; ``wakes_seen``: the writer's wake-up
  count the reader last acted on;
* ``tail``: bytes written so far (whole frames only); ``wakes_sent``:
  wake-ups the writer has sent; ``switches``: how often it went over to
  the socket, for frames that do not fit (:mod:`.shm_link`), and in one of
  :data:`SWITCH_SLOTS` slots the tail at each: the reader reads no further
  than the next switch until told, on the socket, that the writer is back
  from it (``resumed``, the reader's, counts those).

The wake-ups themselves travel on the stream beside the ring
(:mod:`.shm_link`). Deciding whether to send one is Dekker's problem: each
side stores its own word, then loads the other's, and both loads must not
see the old values. :func:`fence` orders them. The data itself needs no
fence on x86-64, whose stores become visible in program order and whose
loads are not reordered with each other; :func:`supported` limits rings to it.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
import threading

__all__ = ["ShmRing", "fence", "supported", "CONTROL_BYTES", "SWITCH_SLOTS"]

CONTROL_BYTES = 4096
_MAGIC = 0x676E_6972_6461_7361  # "asadring", little-endian
NONCE_BYTES = 16
# Word indices (8 bytes each) in the control page; one cache line per writer.
_W_MAGIC, _W_CAPACITY, _W_NONCE = 0, 1, 2  # written once, by the creator (the reader)
_W_HEAD, _W_POLLING, _W_WAKES_SEEN, _W_RESUMED = 8, 9, 10, 11  # the reader's
_W_TAIL, _W_SWITCHES, _W_WAKES_SENT = 16, 17, 18  # the writer's
_W_SWITCH_AT = 24  # the writer's too: SWITCH_SLOTS words, the tail at each switch
#: Switches the writer may be ahead of the reader's resuming.
SWITCH_SLOTS = 32

_barrier = threading.Lock()


def fence() -> None:
    """A full memory barrier: earlier stores are visible before later loads.

    Taking and releasing a lock is an atomic read-modify-write in CPython
    (a semaphore on Linux), which x86-64 never reorders with other memory
    accesses: the same instruction C11's ``atomic_thread_fence`` compiles to.
    """
    _barrier.acquire()
    _barrier.release()


def supported() -> bool:
    """Whether this platform has rings: Linux (memfd, ``/proc``) on x86-64."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") and hasattr(os, "memfd_create")


class ShmRing:
    """One direction of a shared-memory link between two processes.

    Make it with :meth:`create` (the reader) or :meth:`attach` (the writer).
    Each method belongs to one side, as its name says; neither blocks.
    """

    __slots__ = ("capacity", "_mask", "_map", "_words", "_data", "_count", "_wakes_sent", "_switches")

    def __init__(self, mapping: mmap.mmap, capacity: int) -> None:
        self.capacity = capacity
        self._mask = capacity - 1
        self._map = mapping
        whole = memoryview(mapping)
        self._words = whole[:CONTROL_BYTES].cast("Q")
        self._data = whole[CONTROL_BYTES : CONTROL_BYTES + capacity]
        self._count = 0  # this side's bytes moved (head for the reader, tail for the writer)
        self._wakes_sent = 0
        self._switches = 0  # the writer: switches made; the reader: switches resumed from

    @classmethod
    def create(cls, capacity: int) -> tuple[ShmRing, int, bytes]:
        """A new ring of ``capacity`` bytes (a power of two) for this process to read.

        Returns the ring, the descriptor of its memory (for the writer to
        open; close it once the writer has, or has given up) and its nonce.

        Raises:
            OSError: the memory cannot be made.
        """
        if capacity < 4096 or capacity & (capacity - 1):
            raise ValueError(f"a ring's capacity must be a power of two of at least 4096 bytes, got {capacity}")
        fd = os.memfd_create("asyncdist-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, CONTROL_BYTES + capacity)
            ring = cls(mmap.mmap(fd, CONTROL_BYTES + capacity), capacity)
        except OSError:
            os.close(fd)
            raise
        nonce = os.urandom(NONCE_BYTES)
        words = ring._words
        words[_W_NONCE], words[_W_NONCE + 1] = int.from_bytes(nonce[:8], "little"), int.from_bytes(nonce[8:], "little")
        words[_W_CAPACITY] = capacity
        words[_W_MAGIC] = _MAGIC
        return ring, fd, nonce

    @classmethod
    def attach(cls, pid: int, fd: int, nonce: bytes, capacity: int) -> ShmRing:
        """Open, to write, the ring that process ``pid`` made as descriptor ``fd``.

        Raises:
            OSError: it cannot be opened from here (another host, namespace
                or user), or it is not the ring that ``nonce`` names.
        """
        if capacity < 4096 or capacity & (capacity - 1) or len(nonce) != NONCE_BYTES:
            raise OSError(f"malformed ring offer (capacity {capacity}, nonce of {len(nonce)} bytes)")
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(handle).st_size != CONTROL_BYTES + capacity:
                raise OSError(f"/proc/{pid}/fd/{fd} is not a ring of {capacity} bytes")
            ring = cls(mmap.mmap(handle, CONTROL_BYTES + capacity), capacity)
        finally:
            os.close(handle)
        words = ring._words
        found = words[_W_NONCE].to_bytes(8, "little") + words[_W_NONCE + 1].to_bytes(8, "little")
        if words[_W_MAGIC] != _MAGIC or words[_W_CAPACITY] != capacity or found != nonce:
            ring.close()
            raise OSError(f"/proc/{pid}/fd/{fd} is not the ring offered (another host's process?)")
        return ring

    def close(self) -> None:
        """Unmap the memory (this side); the ring is unusable afterwards."""
        self._words.release()
        self._data.release()
        try:
            self._map.close()
        except BufferError:
            pass  # a view of it is still alive somewhere: unmapped when that goes

    # -- writer ----------------------------------------------------------------

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the room the reader has left."""
        return self._count + nbytes - self._words[_W_HEAD] <= self.capacity

    def put(self, view: memoryview) -> None:
        """Copy ``view`` (bytes; check :meth:`fits` first) after what was put
        before. Not visible to the reader until :meth:`publish`."""
        n = view.nbytes
        start = self._count & self._mask
        first = min(n, self.capacity - start)
        self._data[start : start + first] = view[:first]
        if first < n:
            self._data[: n - first] = view[first:]
        self._count += n

    def publish(self) -> None:
        """Make every byte :meth:`put` so far visible to the reader."""
        self._words[_W_TAIL] = self._count

    def reader_polls(self) -> bool:
        """Whether the reader says it looks at the ring unprompted now."""
        return bool(self._words[_W_POLLING])

    def wake_needed(self) -> bool:
        """After :meth:`publish`: whether the reader must be told (it is not
        polling, and no earlier wake-up is still unanswered). True counts
        the wake-up as sent."""
        fence()
        words = self._words
        if words[_W_POLLING] or words[_W_WAKES_SEEN] != self._wakes_sent:
            return False
        self._wakes_sent += 1
        words[_W_WAKES_SENT] = self._wakes_sent
        return True

    def switch(self) -> int:
        """Say that the writer goes over to the socket after what it has
        published; the switch's number (sent back with the frame that ends it)."""
        number = self._switches + 1
        self._words[_W_SWITCH_AT + number % SWITCH_SLOTS] = self._count
        self._words[_W_SWITCHES] = self._switches = number
        return number

    def can_switch_again(self) -> bool:
        """Whether a slot is free for one more switch (the reader has resumed
        from enough of them): only then may the writer come back to the ring."""
        return self._switches + 1 - self._words[_W_RESUMED] < SWITCH_SLOTS

    # -- reader ----------------------------------------------------------------

    def readable(self) -> int:
        """Bytes published and not read yet, up to the writer's next switch
        to the socket until it is back from it (:meth:`resume`)."""
        words = self._words
        end = words[_W_TAIL]  # first: a tail past a switch means the switch is visible
        upcoming = self._switches + 1
        if words[_W_SWITCHES] >= upcoming:
            end = min(end, words[_W_SWITCH_AT + upcoming % SWITCH_SLOTS])
        return end - self._count

    def resume(self, number: int) -> None:
        """The writer is back from switch ``number`` (:meth:`switch`'s)."""
        self._words[_W_RESUMED] = self._switches = number

    def get(self, dest: memoryview, limit: int) -> int:
        """Copy up to ``limit`` published bytes (at most ``dest.nbytes``) into
        ``dest`` and free their room; the count copied."""
        n = min(limit, dest.nbytes)
        start = self._count & self._mask
        first = min(n, self.capacity - start)
        dest[:first] = self._data[start : start + first]
        if first < n:
            dest[first:n] = self._data[: n - first]
        self._count += n
        self._words[_W_HEAD] = self._count
        return n

    def acknowledge_wake(self) -> None:
        """The reader is acting on a wake-up: later writes ring again. Followed
        by a :func:`fence`, so the look at the ring that follows sees every
        write whose writer saw the old count."""
        self._words[_W_WAKES_SEEN] = self._words[_W_WAKES_SENT]
        fence()

    def set_polling(self, polling: bool) -> None:
        """Say whether the reader looks at the ring unprompted (writers then
        need not wake it). Stopping is followed by a :func:`fence`: the look
        that must follow sees every write whose writer saw it polling."""
        self._words[_W_POLLING] = int(polling)
        if not polling:
            fence()

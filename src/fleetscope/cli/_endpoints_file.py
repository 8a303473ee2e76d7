"""``watch --endpoints-file``: the file of endpoints ``watch`` follows, and when a change to it
is applied (docs/bad-data.md §12, docs/sinks.md).

The follower reads the file every ``ENDPOINTS_FILE_READ_S``; each read is one ``open``, with
the file's ``fstat`` before and after (a read during a write is thrown away). A content that
differs from the one applied is applied when:

* the file was replaced (another inode than at the previous read: a rename) and the content is
  ordinary: at once;
* it is ordinary and two consecutive reads give the same stamp (inode, size, mtime, digest);
* it is *suspect*: it lists no server while servers from it are watched (removing every
  endpoint), or its last line has no newline (a line still being written, cut mid-port):
  only once the same stamp has been read ``ENDPOINTS_FILE_EVIDENCE_READS`` times over at
  least ``max(ENDPOINTS_FILE_EVIDENCE_S, 2 poll intervals)``. Meanwhile the fleet is kept and
  one warning names the file (rate-limited).

A content that does not parse keeps the fleet as it is, with one warning per distinct problem.
A URL that leaves the file and comes back gets its old name back (its series continue in every
sink); a new URL gets the next name never used.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetscope.cli._common import role_and_url, url_problem

if TYPE_CHECKING:
    from fleetscope.collector.core import Collector
    from fleetscope.sources.http.source import Endpoint

log = logging.getLogger("fleetscope")

#: how the endpoints-file helpers wait (``asyncio.sleep`` unless a test passes its own)
Pause = Callable[[float], Awaitable[object]]

#: the two reads of the file at start agree this far apart
ENDPOINTS_FILE_SETTLE_S = 0.2
#: the follower reads the file this often
ENDPOINTS_FILE_READ_S = 1.0
#: a suspect content (no server, a last line without newline) is applied only once unchanged
#: for this long (or two poll intervals, if longer) and this many reads
ENDPOINTS_FILE_EVIDENCE_S = 5.0
ENDPOINTS_FILE_EVIDENCE_READS = 3
#: a file bigger than this is not an endpoints file
MAX_BYTES = 1 << 20


def read_endpoints_file(path: str) -> list[Endpoint]:
    """An endpoints file: one endpoint per line, ``URL`` or ``prefill=URL`` / ``decode=URL``;
    blank lines and ``#`` comments are ignored."""
    with open(path, encoding="utf-8") as f:
        return parse_endpoints_text(f.read())


def parse_endpoints_text(text: str) -> list[Endpoint]:
    """The endpoints listed in an endpoints file's text (see :func:`read_endpoints_file`);
    ``ValueError`` naming the line for anything that is not a URL."""
    from fleetscope.sources.http.source import Endpoint

    eps: list[Endpoint] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            role, url = role_and_url(line)
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}") from None
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(f"line {lineno}: {problem}")
        eps.append(Endpoint(url=url, role=role))
    return eps


async def read_stable_text(
    path: str, settle: float = ENDPOINTS_FILE_SETTLE_S, pause: Pause | None = None
) -> str:
    """The file's text once two reads ``settle`` seconds apart agree (the read at start);
    ``OSError`` if unreadable, ``ValueError`` if it keeps changing (five tries)."""
    import asyncio

    pause = pause or asyncio.sleep
    for _ in range(5):  # newlines as in the file, as the follower reads it (read_file)
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            first = f.read()
        await pause(settle)
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            second = f.read()
        if first == second:
            return second
    raise ValueError("still being written (it changed between reads); will read it again")


@dataclass(frozen=True)
class FileRead:
    """One whole read of the file: its text and its stamp."""

    inode: int
    size: int
    mtime_ns: int
    digest: str
    text: str

    @property
    def stamp(self) -> tuple[int, int, int, str]:
        return (self.inode, self.size, self.mtime_ns, self.digest)


def read_file(path: str) -> FileRead | None:
    """The file read once; ``None`` if it changed while it was read (a writer at work);
    ``OSError`` if it cannot be read, ``ValueError`` if it is too big."""
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        if before.st_size > MAX_BYTES:
            raise ValueError(f"{before.st_size} bytes: too big for an endpoints file")
        data = f.read(MAX_BYTES + 1)
        after = os.fstat(f.fileno())
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(
        data
    ) != after.st_size:
        return None
    return FileRead(
        inode=after.st_ino,
        size=after.st_size,
        mtime_ns=after.st_mtime_ns,
        digest=hashlib.sha256(data).hexdigest(),
        text=data.decode("utf-8", errors="replace"),
    )


def unfinished_last_line(text: str) -> bool:
    """A last line with something before its comment, and no newline: still being written?"""
    last = text.rsplit("\n", 1)[-1]
    return bool(last.split("#", 1)[0].strip())


class EndpointsFileRule:
    """When a content of the file is applied (the rules in the module's docstring), fed one
    :class:`FileRead` at a time. ``applied``: the text the fleet was built from; ``watching``:
    how many servers from the file are watched now."""

    def __init__(
        self,
        *,
        applied: str | None,
        watching: int,
        evidence_s: float = ENDPOINTS_FILE_EVIDENCE_S,
        evidence_reads: int = ENDPOINTS_FILE_EVIDENCE_READS,
    ) -> None:
        self.applied = applied
        self.watching = watching
        self.evidence_s = evidence_s
        self.evidence_reads = evidence_reads
        self._inode: int | None = None  # at the previous read
        self._candidate: FileRead | None = None  # the content read, not applied yet
        self._since = 0.0  # when the candidate was first read
        self._reads = 0  # reads of the candidate in a row
        self._replaced = False  # the candidate came with a new inode
        self._changing_since: float | None = None  # unapplied contents, one after another

    def torn(self, now: float) -> None:
        """A read during a write: the candidate starts over."""
        self._candidate = None
        if self._changing_since is None:
            self._changing_since = now

    def observe(self, read: FileRead, now: float) -> tuple[list[Endpoint] | None, str | None]:
        """``(endpoints to apply, None)`` when ``read`` is to be applied; ``(None, why)`` while
        it waits (``why``: a suspect content's reason, else ``None``); ``ValueError`` for a
        settled content that does not parse."""
        replaced = self._inode is not None and read.inode != self._inode
        self._inode = read.inode
        if read.text == self.applied:
            self._candidate = self._changing_since = None
            return None, None
        if self._candidate is not None and self._candidate.stamp == read.stamp:
            self._reads += 1
        else:
            self._candidate, self._since, self._reads = read, now, 1
            self._replaced = replaced
            if self._changing_since is None:
                self._changing_since = now
        settled = self._replaced or self._reads >= 2
        try:
            endpoints = parse_endpoints_text(read.text)
        except ValueError:
            if settled:
                self._changing_since = None  # it stays put: broken, not being written
                raise
            return None, self._churning(now)  # half-written, perhaps: read it again first
        why = self._suspect(read.text, endpoints)
        if why is not None:
            enough = self._reads >= self.evidence_reads and now - self._since >= self.evidence_s
            if not enough:
                return None, why
        elif not settled:
            return None, self._churning(now)
        self.applied, self.watching = read.text, len(endpoints)
        self._candidate = self._changing_since = None
        return endpoints, None

    def _churning(self, now: float) -> str | None:
        """Why nothing is applied when the file changes at every read, for long."""
        since = self._changing_since
        if since is None or now - since < self.evidence_s:
            return None
        return "keeps changing (still being written?); nothing applied until two reads agree"

    def _suspect(self, text: str, endpoints: Sequence[Endpoint]) -> str | None:
        if not endpoints and self.watching:
            return (
                f"lists no server (being rewritten?); its {self.watching} server(s) stay "
                f"watched unless it stays so for {self.evidence_s:g} s"
            )
        if unfinished_last_line(text):
            return (
                "its last line has no newline (still being written?); applied only once "
                f"unchanged for {self.evidence_s:g} s"
            )
        return None


async def follow_endpoints_file(
    collector: Collector,
    path: str,
    fixed: Sequence[Endpoint],
    interval: float,
    *,
    pause: Pause | None = None,
    clock: Callable[[], float] | None = None,
    applied: str | None = None,
    every: float = ENDPOINTS_FILE_READ_S,
) -> None:
    """Read ``path`` every ``every`` seconds and make the watched fleet ``fixed`` + its
    endpoints when a change is to be applied (:class:`EndpointsFileRule`; ``interval``: the
    poll interval). A file that cannot be read or parsed keeps the fleet as it is, with one
    warning per distinct problem. ``applied``: the text the fleet was built from already (at
    start), so it is not applied again."""
    import asyncio
    import time

    from fleetscope.util.redact import redact
    from fleetscope.util.warn import RateLimitedWarner

    pause = pause or asyncio.sleep
    clock = clock or time.monotonic
    fixed_urls = {e.url for e in fixed}
    # the name each URL had: a server that comes back gets it again
    names = {e.url: e.name for e in collector.endpoints}
    rule = EndpointsFileRule(
        applied=applied,
        watching=sum(1 for url in names if url not in fixed_urls),
        evidence_s=max(ENDPOINTS_FILE_EVIDENCE_S, 2 * interval),
    )
    waits = RateLimitedWarner(log, prefix="fleetscope: ")
    last_problem: str | None = None
    while True:
        read: FileRead | None = None
        problem = None
        try:
            read = read_file(path)
            if read is None:
                rule.torn(clock())
            else:
                endpoints, why = rule.observe(read, clock())
                if why is not None and why != last_problem:  # once per wait, rate-limited
                    waits.warn(why, f"endpoints file {path}: {why}")
                problem = why
                if endpoints is not None:
                    endpoints = [_named(e, names) for e in endpoints]
                    _apply(collector, path, [*fixed, *endpoints], names)
        except (OSError, ValueError) as e:
            problem = str(e)
            if problem != last_problem:  # once per distinct problem, not every read
                log.warning(
                    "fleetscope: endpoints file %s: %s; fleet unchanged", path, redact(problem)
                )
        if read is not None or problem is not None:
            last_problem = problem
        await pause(every)


def _named(endpoint: Endpoint, names: dict[str, str]) -> Endpoint:
    name = names.get(endpoint.url)
    return replace(endpoint, name=name) if name and not endpoint.name else endpoint


def _apply(
    collector: Collector, path: str, endpoints: list[Endpoint], names: dict[str, str]
) -> None:
    from fleetscope.util.redact import redact

    added, removed = collector.set_endpoints(endpoints)
    names.update((e.url, e.name) for e in added)
    if added or removed:
        changes = [f"+{e.name}={e.url}" for e in added]
        changes += [f"-{n}" for n in removed]
        log.warning("fleetscope: %s: fleet changed: %s", path, redact(", ".join(changes)))

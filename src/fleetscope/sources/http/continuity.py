"""Whether an endpoint's server process can be vouched for between two successful scrapes.

A body without a start time (vLLM's multiprocess / DP bodies, SGLang) shows a restart only when
its counters drop: a process that restarted between two scrapes and whose counters then grew
past their old values leaves no trace in the body. The HTTP source has two other kinds of
evidence, kept here per endpoint:

* a failed scrape since the last success (refused, timed out, an error status, a bad body):
  the process was not seen for that time;
* the server closed the kept connection of an earlier scrape sooner than it has let one idle
  before. A server that answered on a connection idle for ``L`` seconds closes idle
  connections (if at all) after more than ``L``; one it closed after clearly less was closed
  for another reason, most likely its process ending (a process cannot hand its connections to
  its successor). A server whose idle timeout is shorter than the poll interval (uvicorn's
  default is 5 s) never lets a connection live from one scrape to the next, so this never
  fires there; a proxy in front keeps its own connections, and then proves nothing either way.

Either gives a doubt (one line saying why); the fold (``fleet/state.py``) turns it into
``continuity_unknown`` for the endpoint's engines that show no start time of their own. Pure
bookkeeping: the wire client measures the idle times (``sources/http/wire.py``).
"""

from __future__ import annotations

__all__ = ["DROP_MARGIN", "DROP_SHARE", "ContinuityEvidence", "early"]

# an early close must beat the longest idle the server allowed by this margin: seconds, plus
# DROP_SHARE of that idle. The server's idle timer starts when it sent the response, ours when
# our loop read it: a loop busy for a while (a trainer's) starts ours late, and polls about as
# far apart as the server's idle timeout (5 s against vLLM's 5 s) must not read as a restart
DROP_MARGIN = 0.1
DROP_SHARE = 0.25


class ContinuityEvidence:
    """Per endpoint: failures since its last success, and how long it lets connections idle."""

    def __init__(self) -> None:
        self._failed: dict[str, str] = {}  # endpoint -> the first failure since its last success
        self._kept: dict[str, float] = {}  # endpoint -> the longest idle it answered after

    def failed(self, endpoint: str, reason: str) -> None:
        self._failed.setdefault(endpoint, reason)

    def succeeded(
        self, endpoint: str, kept_idle: float | None = None, dropped_idle: float | None = None
    ) -> str:
        """The doubt over the interval since ``endpoint``'s last success ("" when none).

        ``kept_idle``: this scrape reused a connection idle that long; ``dropped_idle``: the
        kept connection had idled that long when the server closed it."""
        failed = self._failed.pop(endpoint, None)
        kept = self._kept.get(endpoint)
        if kept_idle is not None and (kept is None or kept_idle > kept):
            self._kept[endpoint] = kept_idle
        if failed is not None:
            return f"was not there to answer a scrape since its last success ({failed})"
        if kept is not None and dropped_idle is not None and early(dropped_idle, kept):
            return (
                f"closed our connection after {dropped_idle:.3g} s idle (it had answered on "
                f"one idle for {kept:.3g} s)"
            )
        return ""

    def forget(self, endpoint: str) -> None:
        self._failed.pop(endpoint, None)
        self._kept.pop(endpoint, None)


def early(closed_after: float, longest_kept: float) -> bool:
    """Whether a server that answered on a connection idle ``longest_kept`` seconds closed one
    after ``closed_after`` for a reason other than idleness."""
    return closed_after + DROP_MARGIN + DROP_SHARE * longest_kept < longest_kept

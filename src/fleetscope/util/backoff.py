"""The side requests' retry rule (``/v1/models``, roles, versions, the RL probes).

After a failure the next try waits 30 s, doubling up to 15 min; an answer resets the wait.
One rule for every side request, so one endpoint that does not answer costs at most one
request per wait, and a recovered one is asked at the normal pace again (docs/trainer-safety.md).
"""

from __future__ import annotations

from dataclasses import dataclass

RETRY_FIRST = 30.0
RETRY_MAX = 900.0


@dataclass(slots=True)
class Backoff:
    """When to try again (monotonic seconds) and how long the next failure waits."""

    next_try: float = 0.0
    wait: float = RETRY_FIRST

    def due(self, now: float) -> bool:
        return now >= self.next_try

    def failed(self, now: float) -> float:
        """A failure at ``now``: the next try waits :attr:`wait`, which doubles. Returns it."""
        waited = self.wait
        self.next_try = now + waited
        self.wait = min(waited * 2, RETRY_MAX)
        return waited

    def succeeded(self) -> None:
        self.next_try = 0.0
        self.wait = RETRY_FIRST

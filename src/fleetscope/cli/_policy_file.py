"""``watch --policy-version-file``: the trainer writes its current policy version into a file;
each poll the CLI looks at the file's stamp (mtime, size, inode: one ``stat``), reads it only
when that changed, and announces its first line with ``Collector.set_policy_version``
(docs/rl-lifecycle.md §3). An empty or unreadable file keeps the current version (one warning
per distinct problem): a trainer that rewrites it in place may leave it empty for a moment, so
write it atomically (a temporary file, then rename)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetscope.collector.core import Collector
    from fleetscope.fleet.view import FleetView

log = logging.getLogger("fleetscope")


class PolicyVersionFile:
    """Follows one file; :meth:`check` is cheap when nothing changed (one ``stat``)."""

    def __init__(self, path: str, collector: Collector):
        self.path = path
        self.collector = collector
        self.version: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._last_error: str | None = None

    def check(self) -> str | None:
        """Announce the file's version if the file changed; returns the current one."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return self.version
            with open(self.path, encoding="utf-8", errors="replace") as f:
                text = f.read(4096)
            line = text.strip().splitlines()[0].strip() if text.strip() else ""
            if not line:
                raise ValueError("empty (no version in it yet)")
            self._stamp, self._last_error = stamp, None
            if line != self.version:
                self.version = line
                self.collector.set_policy_version(line)
        except (OSError, ValueError) as e:
            self._stamp = None  # look again next poll
            if str(e) != self._last_error:
                self._last_error = str(e)
                log.warning(
                    "fleetscope: policy version file %s: %s; version unchanged (%r)",
                    self.path,
                    e,
                    self.version,
                )
        return self.version

    def on_poll(self, view: FleetView) -> None:
        """A ``Collector(on_poll=...)`` hook: after each poll, for the next one."""
        self.check()

"""The watched endpoints of a source: names, and changes from any thread applied at a poll."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace

from fleetscope.identity import Role
from fleetscope.sources.base import Endpoint
from fleetscope.util.redact import redact


def name_endpoints(
    endpoints: Sequence[str | Endpoint], taken: Iterable[str] = ()
) -> list[Endpoint]:
    """Give unnamed endpoints their display names, counted per role in the order given:
    ``server0, server1`` / ``prefill0`` / ``decode0, decode1``, skipping names in ``taken``."""
    counters: dict[str, int] = {}
    out: list[Endpoint] = []
    taken = set(taken)
    given = [e.name for e in endpoints if isinstance(e, Endpoint) and e.name]
    clash = taken.intersection(given)
    if clash:
        raise ValueError(f"endpoint names already in use: {sorted(clash)}")
    taken.update(given)
    for e in endpoints:
        ep = e if isinstance(e, Endpoint) else Endpoint(url=e)
        if not ep.name:
            prefix = ep.role or "server"
            while True:
                i = counters.get(prefix, 0)
                counters[prefix] = i + 1
                if f"{prefix}{i}" not in taken:
                    break
            ep = replace(ep, name=f"{prefix}{i}")
        taken.add(ep.name)
        out.append(ep)
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must be unique: {names}")
    return out


class EndpointSet:
    """The endpoints a source scrapes. ``add`` / ``remove`` / ``set`` may be called from any
    thread; they take effect when the source calls :meth:`apply` at the start of a poll, so a
    poll never sees the list change under it. A name never belongs to two URLs: an unnamed
    endpoint gets a name never used before, and a name used before may only be given again to
    its own URL (an endpoint that comes back under its old name, its series unbroken)."""

    def __init__(self, endpoints: Sequence[str | Endpoint] = ()) -> None:
        self._lock = threading.RLock()
        self._endpoints: list[Endpoint] = name_endpoints(endpoints)
        self._url_of: dict[str, str] = {e.name: e.url for e in self._endpoints}  # ever given
        self._pending_add: list[Endpoint] = []
        self._pending_remove: list[str] = []

    @property
    def endpoints(self) -> list[Endpoint]:
        """The endpoints scraped at the last poll (with roles discovered so far)."""
        return list(self._endpoints)

    def _watched_urls(self) -> set[str]:
        removed = set(self._pending_remove)
        return {e.url for e in self._endpoints if e.name not in removed} | {
            e.url for e in self._pending_add
        }

    def add(self, *endpoints: str | Endpoint) -> list[Endpoint]:
        """Watch more endpoints from the next poll on. Unnamed ones get the next name never
        used; a name used before may only be given to the URL it was given to. Returns them,
        named."""
        with self._lock:
            watched = self._watched_urls()
            for e in endpoints:
                url = e.url if isinstance(e, Endpoint) else e
                if url in watched:
                    raise ValueError(redact(f"{url} is already watched"))
                watched.add(url)
            back = {
                e.name
                for e in endpoints
                if isinstance(e, Endpoint) and e.name and self._url_of.get(e.name) == e.url
            }
            named = name_endpoints(endpoints, taken=self._url_of.keys() - back)
            self._url_of.update((e.name, e.url) for e in named)
            self._pending_add.extend(named)
        return named

    def remove(self, *endpoints: str | Endpoint) -> list[str]:
        """Stop watching endpoints (by name, URL or :class:`Endpoint`) from the next poll on;
        returns the names removed."""
        wanted = {e.name if isinstance(e, Endpoint) else e for e in endpoints}
        wanted |= {e.url for e in endpoints if isinstance(e, Endpoint)}
        with self._lock:
            keep = [e for e in self._pending_add if not ({e.name, e.url} & wanted)]
            names = [e.name for e in self._pending_add if e not in keep]
            self._pending_add = keep
            for e in self._endpoints:
                if {e.name, e.url} & wanted and e.name not in self._pending_remove:
                    self._pending_remove.append(e.name)
                    names.append(e.name)
        return names

    def assign(self, endpoints: Sequence[str | Endpoint]) -> tuple[list[Endpoint], list[str]]:
        """Make the watched fleet exactly ``endpoints`` (matched by URL; a URL whose role
        changed is removed and added again). Returns ``(added, removed names)``."""
        wanted: dict[str, Endpoint] = {}
        for e in endpoints:
            ep = e if isinstance(e, Endpoint) else Endpoint(url=e)
            if ep.url in wanted:
                raise ValueError(redact(f"{ep.url} is listed twice"))
            wanted[ep.url] = ep
        with self._lock:
            removed_names = set(self._pending_remove)
            current = [e for e in self._endpoints if e.name not in removed_names]
            current += self._pending_add
            drop = [
                e
                for e in current
                if e.url not in wanted or (wanted[e.url].role and wanted[e.url].role != e.role)
            ]
            kept = {e.url for e in current if e not in drop}
            removed = self.remove(*drop) if drop else []
            new = [ep for url, ep in wanted.items() if url not in kept]
            added = self.add(*new) if new else []
        return added, removed

    def apply(self) -> tuple[list[Endpoint], set[str]]:
        with self._lock:
            add, self._pending_add = self._pending_add, []
            remove, self._pending_remove = set(self._pending_remove), []
        if remove:
            self._endpoints = [e for e in self._endpoints if e.name not in remove]
        self._endpoints.extend(add)
        return add, remove

    def set_role(self, name: str, role: Role) -> None:
        """A watched endpoint's discovered role."""
        with self._lock:
            self._endpoints = [
                replace(e, role=role) if e.name == name else e for e in self._endpoints
            ]


class Members:
    """The membership methods of a source whose endpoints live in ``self.members``."""

    members: EndpointSet

    @property
    def endpoints(self) -> list[Endpoint]:
        """The endpoints scraped at the last poll (with roles discovered so far)."""
        return self.members.endpoints

    def add_endpoints(self, *endpoints: str | Endpoint) -> list[Endpoint]:
        """Watch more endpoints from the next poll on (thread-safe); returns them, named."""
        return self.members.add(*endpoints)

    def remove_endpoints(self, *endpoints: str | Endpoint) -> list[str]:
        """Stop watching endpoints (name, URL or :class:`Endpoint`) from the next poll on."""
        return self.members.remove(*endpoints)

    def set_endpoints(
        self, endpoints: Sequence[str | Endpoint]
    ) -> tuple[list[Endpoint], list[str]]:
        """Make the watched fleet exactly ``endpoints`` (matched by URL)."""
        return self.members.assign(endpoints)

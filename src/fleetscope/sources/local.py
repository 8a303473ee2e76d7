"""What the sources of colocated engines share: metric families read in this process, in a
worker thread, parsed as the HTTP source parses a body, one :class:`ScrapeResult` per poll.

A subclass says how to read the families (:meth:`LocalSource.collect`: this process's registry,
a multiprocess directory); everything after that is here, so both give the same results as a
scrape of the same state over HTTP: the lines ``generate_latest`` would write
(:mod:`.families`), one :class:`~fleetscope.exposition.Parser` kept between polls (its fast
path), the engine kind from the body and the version of the engine's package when this process
has imported it. Reading and parsing run in one worker thread, never on the caller's event loop.
Nothing is raised: a read that fails, or finds no engine, is a failed scrape and a rate-limited
warning.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from fleetscope.catalog import engine_kind
from fleetscope.exposition import Exposition, ExpositionError, Parser
from fleetscope.identity import Role, validate_endpoint_name
from fleetscope.sources.base import Departure, ScrapeResult
from fleetscope.sources.families import DEFAULT_KEEP, LineWriter, MetricFamily, family_lines
from fleetscope.util.warn import RateLimitedWarner

__all__ = ["LocalSource", "NoEngineError", "package_version"]

log = logging.getLogger("fleetscope")


class NoEngineError(RuntimeError):
    """The families read hold no engine family (yet): a failed scrape, with this reason."""


def package_version(kind: str | None) -> str | None:
    """``vllm.__version__`` / ``sglang.__version__`` when this process has imported it (never
    imports it)."""
    module = sys.modules.get(kind) if kind in ("vllm", "sglang") else None
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) and version else None


class LocalSource:
    """Base of the sources that read metric families in this process; one endpoint, ``name``.

    Subclasses implement :meth:`collect` (called in the worker thread) and :meth:`where` (what
    warnings name)."""

    def __init__(
        self,
        *,
        name: str = "server0",
        role: Role | None = None,
        groups: Sequence[str] = (),
        keep: Sequence[str] | None = DEFAULT_KEEP,
        warn_interval: float = 60.0,
        thread_name: str = "fleetscope-local",
    ) -> None:
        if role not in (None, "prefill", "decode"):
            raise ValueError(f"role must be 'prefill', 'decode' or None, not {role!r}")
        self.name = validate_endpoint_name(name)
        self.role: Role | None = role
        self.groups = tuple(groups)
        self.keep = tuple(keep) if keep is not None else None
        self._parser = Parser()
        self._writer = LineWriter()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=thread_name)
        self._warner = RateLimitedWarner(log, interval=warn_interval, prefix="fleetscope: ")
        self._closed = False
        #: seconds the last poll's read (``collect``) and conversion + parse took
        self.last_read_seconds = 0.0
        self.last_parse_seconds = 0.0

    # ------------------------------------------------------------------ for subclasses

    def collect(self) -> Iterable[MetricFamily]:
        """The metric families of this poll (in the worker thread)."""
        raise NotImplementedError

    def where(self) -> str:
        """Where the families come from, for messages."""
        raise NotImplementedError

    def warn(self, kind: str, message: str) -> None:
        self._warner.warn(f"{self.name}:{kind}", message)

    # ------------------------------------------------------------------ the source contract

    def take_departures(self) -> list[Departure]:
        return []  # one endpoint, for the source's whole life

    async def aclose(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def scrape(self) -> list[ScrapeResult]:
        """One poll: the families read and parsed in the worker thread. Never raises."""
        t0 = time.monotonic()
        if self._closed:
            return [self._failed(t0, "source closed")]
        try:
            loop = asyncio.get_running_loop()
            expo, t, wall = await loop.run_in_executor(self._pool, self.read)
        except NoEngineError as e:
            return [self._failed(t0, str(e))]
        except ExpositionError as e:
            return [self._failed(t0, f"bad exposition: {e}")]
        except Exception as e:
            return [self._failed(t0, f"read failed: {type(e).__name__}: {e}")]
        kind = engine_kind(expo.types)
        return [
            ScrapeResult(
                self.name,
                expo,
                t,
                wall,
                latency=t - t0,
                role=self.role,
                groups=self.groups,
                engine_roles=expo.engine_roles if self.role is None else {},
                engine_kind=kind,
                server_version=package_version(kind),
            )
        ]

    def read(self) -> tuple[Exposition, float, float]:
        """Read and parse one poll's families (blocking: the worker thread calls it)."""
        t0 = time.perf_counter()
        metrics = list(self.collect())
        t, wall = time.monotonic(), time.time()  # the values were taken just now
        t1 = time.perf_counter()
        lines = family_lines(metrics, self.keep, self._writer)
        if engine_kind(line[7 : line.index(" ", 7)] for line in lines if line[0] == "#") is None:
            raise NoEngineError(
                f"no vllm: or sglang: families in {self.where()} (no engine yet, or one created "
                "without stats: vLLM's LLM() needs disable_log_stats=False)"
            )
        lines.append("")
        expo = self._parser.parse("\n".join(lines), time=t, wall_time=wall)
        self.last_read_seconds = t1 - t0
        self.last_parse_seconds = time.perf_counter() - t1
        return expo, t, wall

    def _failed(self, t0: float, reason: str) -> ScrapeResult:
        self.warn("read", f"{self.name} ({self.where()}): {reason}")
        now = time.monotonic()
        return ScrapeResult(
            self.name,
            None,
            now,
            time.time(),
            latency=now - t0,
            error=reason,
            role=self.role,
            groups=self.groups,
        )

"""Engines whose metrics are prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``):
vLLM's API servers with data parallelism or several API server processes, SGLang's schedulers,
a trainer's own worker processes. :class:`MultiprocessSource` reads the directory itself, as
prometheus_client's ``MultiProcessCollector`` does, so no process has to serve ``/metrics``.

Reading: each ``*.db`` file with prometheus_client's own reader
(``MmapedDict.read_all_values_from_file``), then the files merged exactly as
``MultiProcessCollector.merge(files, accumulate=True)`` merges them (:func:`merge`: counters and
summaries summed over processes, histogram buckets summed then made cumulative with their
``_count``, gauges by their mode: ``all`` / ``liveall`` one series per ``pid``, ``sum`` /
``livesum``, ``max`` / ``livemax``, ``min`` / ``livemin``, ``mostrecent`` /
``livemostrecent``). ``tests/sources/test_multiproc.py`` checks the result against
``MultiProcessCollector`` itself.

What it adds, because it reads the same files poll after poll:

* a file that cannot be read (torn, cut short, a key that is not JSON, a name that is not
  ``{type}_{pid}.db`` / ``gauge_{mode}_{pid}.db``) is a rate-limited warning naming the file,
  never an exception; its last good values stand in for it (a counter never goes backwards
  because one read failed), and a file never read yet is left out;
* a file that disappears (a process's files removed, ``mark_process_dead`` for ``live*``
  gauges): its counters, histograms and summaries keep their last values in the sums (a counter
  never goes backwards because a worker exited and its files went); its gauges go with it.
  Files of processes that died stay in the directory and are read as they are, as
  prometheus_client reads them;
* a file replaced by another at the same path (a new inode, or a counter, bucket or count
  lower than at the last read: a new process with a reused pid) is a new file, and the old
  one's values are kept as if it had disappeared. (Scraped over HTTP, that decrease of the sum
  would read as a reset of the whole engine, and everything the other files hold would be
  counted again);
* an empty file (a process creating it this very moment) is skipped without a warning.
"""

from __future__ import annotations

import json
import os
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.utils import floatToGoString

from fleetscope.identity import Role
from fleetscope.sources.families import DEFAULT_KEEP, MetricFamily
from fleetscope.sources.local import LocalSource, NoEngineError

__all__ = ["FileValues", "MultiprocFiles", "MultiprocessSource", "merge"]

#: file types whose values only add up (kept when their file goes)
CUMULATIVE_TYPES = ("counter", "histogram", "summary")
_GROWING = ("_total", "_bucket", "_count")  # samples that never go down within one process
FILE_TYPES = ("counter", "gauge", "histogram", "summary")
# modes whose series drop the `pid` label (one series per label set, over the processes)
_SUMMED_MODES = frozenset(("min", "livemin", "max", "livemax", "sum", "livesum"))
_SUMMED_MODES |= {"mostrecent", "livemostrecent"}
GAUGE_MODES = _SUMMED_MODES | {"all", "liveall"}

_USED = struct.Struct("i")  # a file's first 4 bytes: how much of it is used
# prometheus_client's own reader and `le` writer (untyped there)
_read_entries: Callable[[str], Iterable[tuple[str, float, float, int]]] = (
    MmapedDict.read_all_values_from_file
)
_go_string: Callable[[float], str] = floatToGoString

Labels = tuple[tuple[str, str], ...]
#: a parsed file key: metric (family) name, sample name, sorted labels, help text
Key = tuple[str, str, Labels, str]


@dataclass(slots=True)
class FileValues:
    """One file's entries: its type, its gauge mode ("" otherwise), its process id."""

    typ: str
    mode: str
    pid: str
    entries: list[tuple[Key, float, float]] = field(default_factory=list)  # key, value, time


class FileError(ValueError):
    """A file that cannot be used this time."""


def file_kind(path: str) -> tuple[str, str, str]:
    """(type, gauge mode, pid) from a file name, as ``MultiProcessCollector`` reads it."""
    parts = os.path.basename(path).split("_")
    typ = parts[0]
    if typ not in FILE_TYPES:
        raise FileError(f"not a prometheus_client multiprocess file name (type {typ!r})")
    if typ != "gauge":
        return typ, "", ""
    if len(parts) < 3 or parts[1] not in GAUGE_MODES:
        raise FileError("a gauge file name without a multiprocess mode and pid")
    return typ, parts[1], parts[2][:-3]


def _parse_key(text: str) -> Key:
    try:
        metric_name, name, labels, help_text = json.loads(text)
    except (ValueError, TypeError) as e:
        raise FileError(f"an entry's key is not prometheus_client's ({e})") from None
    if not (
        isinstance(metric_name, str)
        and isinstance(name, str)
        and isinstance(help_text, str)
        and isinstance(labels, dict)
        and all(isinstance(v, str) for v in labels.values())
    ):
        raise FileError(f"an entry's key is not prometheus_client's: {text[:120]!r}")
    return metric_name, name, tuple(sorted(labels.items())), help_text


class MultiprocFiles:
    """The ``*.db`` files of one directory, read poll after poll (see the module doc)."""

    def __init__(self, path: str, warn: Any) -> None:
        self.path = path
        self._warn = warn  # (kind, message): rate limited
        self._keys: dict[str, Key] = {}
        self._last: dict[str, tuple[tuple[int, int], FileValues]] = {}
        self._retired: dict[str, dict[Key, float]] = {}
        self.unreadable: set[str] = set()  # files whose last read failed

    def _key(self, text: str) -> Key:
        key = self._keys.get(text)
        if key is None:
            if len(self._keys) > 1 << 17:  # label values that churn: start afresh
                self._keys.clear()
            key = self._keys[text] = _parse_key(text)
        return key

    def _read(self, path: str, typ: str, mode: str, pid: str) -> FileValues:
        """One file through prometheus_client's reader, after checks that keep a torn file
        from making it read past the end (or loop: a garbage length can move it backwards)."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
        if len(head) < 8:
            raise FileError(f"cut short: {len(head)} bytes, less than its 8-byte header")
        used = _USED.unpack_from(head)[0]
        if used != 0 and not 8 <= used <= size:
            raise FileError(f"cut short: it declares {used} bytes used, it has {size}")
        out = FileValues(typ, mode, pid)
        last = -1
        try:
            for text, value, stamp, pos in _read_entries(path):
                if pos <= last:
                    raise FileError("torn: its entries run backwards")
                last = pos
                out.entries.append((self._key(text), value, stamp))
        except (RuntimeError, UnicodeDecodeError, struct.error) as e:
            raise FileError(f"torn: {e}") from None
        return out

    def read(self) -> list[Metric]:
        """Every file read (or its last good values), merged; files gone retired."""
        try:
            # in the directory's order, as glob gives MultiProcessCollector: floats are summed
            # over the files in the same order, so the sums are the same to the last bit
            names = [n for n in os.listdir(self.path) if n.endswith(".db") and n[0] != "."]
        except FileNotFoundError:
            raise NoEngineError(f"multiprocess directory {self.path} does not exist") from None
        current: list[FileValues] = []
        seen: set[str] = set()
        for name in names:
            path = os.path.join(self.path, name)
            values = self._one(path)
            if values is not None:
                seen.add(path)
                current.append(values)
        for path in [p for p in self._last if p not in seen]:
            self._retire(path)
        return merge([*current, *self._retired_values()])

    def _one(self, path: str) -> FileValues | None:
        """A file's values this poll: read, else its last good ones (None: leave it out)."""
        try:
            typ, mode, pid = file_kind(path)
            st = os.stat(path)
            ident = (st.st_dev, st.st_ino)
            last = self._last.get(path)
            if last is not None and last[0] != ident:
                self._retire(path)  # another file at the same path: a new one
                last = None
            if st.st_size == 0:  # being created right now
                return last[1] if last is not None else None
            values = self._read(path, typ, mode, pid)
        except FileNotFoundError:
            return None  # gone since the listing
        except (FileError, OSError) as e:
            self.unreadable.add(path)
            last = self._last.get(path)
            kept = "its last good values are used" if last else "left out until it reads"
            self._warn(f"file:{path}", f"multiprocess file {path} unreadable ({e}): {kept}")
            return last[1] if last is not None else None
        self.unreadable.discard(path)
        last = self._last.get(path)
        if last is not None and _went_down(last[1], values):
            self._retire(path)  # a new process writing a file of the same name (pid reuse)
        self._last[path] = (ident, values)
        return values

    def _retire(self, path: str) -> None:
        _ident, values = self._last.pop(path)
        self.unreadable.discard(path)
        if values.typ in CUMULATIVE_TYPES:
            sums = self._retired.setdefault(values.typ, {})
            for key, value, _stamp in values.entries:
                sums[key] = sums.get(key, 0.0) + value

    def _retired_values(self) -> list[FileValues]:
        return [
            FileValues(typ, "", "", [(k, v, 0.0) for k, v in sums.items()])
            for typ, sums in self._retired.items()
        ]


def _went_down(before: FileValues, now: FileValues) -> bool:
    """Whether a value that only grows within one process (a counter, a bucket, a count) is
    lower than in the file's last read: the file is another process's."""
    if now.typ not in CUMULATIVE_TYPES:
        return False
    old = {key: value for key, value, _ in before.entries if key[1].endswith(_GROWING)}
    return any(value < old.get(key, value) for key, value, _ in now.entries)


# ----------------------------------------------------------------------------- the merge


@dataclass(slots=True)
class _Family:
    name: str
    help: str
    typ: str
    mode: str = ""
    samples: list[tuple[str, Labels, float, float]] = field(default_factory=list)


def merge(files: Iterable[FileValues]) -> list[Metric]:
    """``MultiProcessCollector.merge(files, accumulate=True)`` of already read files."""
    families: dict[str, _Family] = {}
    for f in files:
        for (metric_name, name, labels, help_text), value, stamp in f.entries:
            fam = families.get(metric_name)
            if fam is None:
                fam = families[metric_name] = _Family(metric_name, help_text, f.typ)
            if f.typ == "gauge":
                fam.mode = f.mode
                fam.samples.append((name, (*labels, ("pid", f.pid)), value, stamp))
            else:
                fam.samples.append((name, labels, value, stamp))
    out = []
    for fam in families.values():
        try:
            metric = Metric(fam.name, fam.help, fam.typ)
        except ValueError:
            continue  # a name prometheus_client itself refuses
        metric.samples = _accumulate(fam)
        out.append(metric)
    return out


def _gauge(
    fam: _Family,
    samples: defaultdict[Labels, dict[tuple[str, Labels], float]],
    stamps: defaultdict[Labels, defaultdict[str, float]],
    sample: tuple[str, Labels, float, float],
) -> None:
    name, labels, value, stamp = sample
    mode = fam.mode
    if mode in _SUMMED_MODES:
        labels = tuple(lab for lab in labels if lab[0] != "pid")
    key = (name, labels)
    if mode in ("min", "livemin"):
        current = samples[labels].setdefault(key, value)
        if value < current:
            samples[labels][key] = value
    elif mode in ("max", "livemax"):
        current = samples[labels].setdefault(key, value)
        if value > current:
            samples[labels][key] = value
    elif mode in ("sum", "livesum"):
        group = samples[labels]
        group[key] = group.get(key, 0.0) + value
    elif mode in ("mostrecent", "livemostrecent"):
        t = float(stamp or 0)
        if stamps[labels][name] < t:
            samples[labels][key] = value
            stamps[labels][name] = t
    else:  # all / liveall
        samples[labels][key] = value


def _accumulate(fam: _Family) -> list[Any]:
    from prometheus_client.samples import Sample

    samples: defaultdict[Labels, dict[tuple[str, Labels], float]] = defaultdict(dict)
    stamps: defaultdict[Labels, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    buckets: defaultdict[Labels, defaultdict[float, float]] = defaultdict(
        lambda: defaultdict(float)
    )
    for sample in fam.samples:
        name, labels, value, _stamp = sample
        if fam.typ == "gauge":
            _gauge(fam, samples, stamps, sample)
            continue
        if fam.typ == "histogram":
            le = next((v for k, v in labels if k == "le"), None)
            if le is not None:
                without_le = tuple(lab for lab in labels if lab[0] != "le")
                buckets[without_le][float(le)] += value
                continue
        group = samples[labels]  # counters, summaries, a histogram's _sum
        group[(name, labels)] = group.get((name, labels), 0.0) + value
    if fam.typ == "histogram":
        for labels, values in buckets.items():
            acc = 0.0
            for bound, value in sorted(values.items()):
                acc += value
                key = (fam.name + "_bucket", (*labels, ("le", _go_string(bound))))
                samples[labels][key] = acc
            samples[labels][(fam.name + "_count", labels)] = acc
    return [
        Sample(name, dict(labels), value)
        for group in samples.values()
        for (name, labels), value in group.items()
    ]


# ----------------------------------------------------------------------------- the source


class MultiprocessSource(LocalSource):
    """A ``PROMETHEUS_MULTIPROC_DIR`` directory as a source (default: that variable).

    Args:
        path: the directory (it may not exist yet: until it does, polls fail with a warning).
        name, role, groups, keep: as :class:`~fleetscope.sources.inprocess.InProcessSource`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        name: str = "server0",
        role: Role | None = None,
        groups: Sequence[str] = (),
        keep: Sequence[str] | None = DEFAULT_KEEP,
        warn_interval: float = 60.0,
    ) -> None:
        super().__init__(
            name=name,
            role=role,
            groups=groups,
            keep=keep,
            warn_interval=warn_interval,
            thread_name="fleetscope-multiproc",
        )
        where = os.fspath(path) if path is not None else os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not where:
            raise ValueError(
                "no multiprocess directory: give path= or set PROMETHEUS_MULTIPROC_DIR"
            )
        self.path = where
        self.files = MultiprocFiles(where, self.warn)

    def collect(self) -> Iterable[MetricFamily]:
        return self.files.read()

    def where(self) -> str:
        return f"multiprocess directory {self.path}"

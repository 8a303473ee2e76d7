"""A private local Ray cluster for tests: its own short temp dir, auth off, always shut down."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray  # the test extra installs Ray: a missing one must fail loudly


@contextmanager
def local_ray(prefix: str, **init_kwargs: Any) -> Iterator[Any]:
    """``ray.init(num_cpus=2, include_dashboard=False, **init_kwargs)`` in a private temp dir.

    The dir is short because Ray's unix socket paths must stay under ~107 characters. The
    environment (``RAY_AUTH_MODE``, ``TMPDIR``) is restored and the dir removed afterwards.
    """
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "TMPDIR")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["TMPDIR"] = tmp
    kwargs = {
        "num_cpus": 2,
        "include_dashboard": False,
        "_temp_dir": tmp,
        "logging_level": logging.WARNING,
        **init_kwargs,
    }
    try:
        yield ray.init(**kwargs)
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)

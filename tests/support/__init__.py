"""Test helpers, imported as ``support.X`` (pytest puts ``tests/`` on the path): ``paths`` (the
data), ``bodies`` (editing exposition text), ``promql`` (the PromQL quantile reference),
``loads`` (simulator loads), ``loopback`` (a hand-made HTTP server), ``prom`` (a real
Prometheus), ``simclock``, ``ray_cluster``. ``tests/conftest.py`` holds fixtures and hooks only.
"""

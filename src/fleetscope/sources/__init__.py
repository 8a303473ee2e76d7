"""Sources: where expositions come from (HTTP, Ray, a Prometheus server); I/O only.

Every source satisfies :class:`fleetscope.sources.base.Source` and returns one
:class:`~fleetscope.sources.base.ScrapeResult` per endpoint each poll."""

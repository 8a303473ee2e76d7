"""One poll of the fleet: the state kept between polls, the poll pipeline, the typed
view, the run report and the collector configuration."""

"""The collector: the poll loop that drives the flow (inline, or in a supervised child
process), the window and weight-sync handles, signals, the trainer-thread bridge, Ray shards."""

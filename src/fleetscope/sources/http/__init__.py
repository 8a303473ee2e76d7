"""The HTTP source: a fast /metrics client, the endpoint set and its membership changes."""

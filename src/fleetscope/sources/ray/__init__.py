"""The Ray source: engines behind a Ray metrics agent, told apart by their worker identity."""

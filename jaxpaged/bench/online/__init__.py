"""Online benchmarks: request sets sent to a live OpenAI-compatible server (or a Ray Serve cluster) and timed."""

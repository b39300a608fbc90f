"""What the benchmark, the demo's tests and the test suite share, and production code never imports.

* `redis_server`: start and stop local redis-server processes, each on a free port (no persistence unless asked).
* `workload`: a seeded synthetic incident workload (Zipf vocabulary, near duplicates).
* `benchmark`: the measurements behind `incident-worker bench`, and their Markdown report.
"""

"""Real redis-server processes for tests (the class lives in the package: the benchmark starts servers too)."""

from worker.localserver import RedisServer, free_port, redis_server_available

__all__ = ["RedisServer", "free_port", "redis_server_available"]

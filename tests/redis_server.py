"""Real redis-server processes for tests (the class lives in worker/devtools: the benchmark starts servers too)."""

from worker.devtools.redis_server import RedisServer, free_port, redis_server_available

__all__ = ["RedisServer", "free_port", "redis_server_available"]

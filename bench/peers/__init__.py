"""``python -m bench.peers``: raw asyncpg, episodic and three agent frameworks' session stores
(OpenAI Agents SDK, Google ADK, LangGraph), the same workloads on one PostgreSQL, in one run.

Results go to ``bench/PEERS.md`` and ``bench/load_latency.png``. Every figure is a measurement
of a shared, noisy machine: read the ratios. Nothing here asserts on timings.
"""

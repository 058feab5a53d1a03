"""The agent's Prometheus metrics: cycles folded into counters, device health.

``cycle_metrics`` (every CycleReport folded, and the registry), ``scrape_series``
(what is read at scrape time, and the per-GPU cap gauges), ``device_metrics`` (faults
and telemetry) and ``endpoint`` (the task that serves them). Imports the agent, the
server's gRPC publication and HTTP edge, and the kit.
"""

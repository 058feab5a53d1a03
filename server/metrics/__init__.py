"""The agent's Prometheus metrics: cycles folded into counters, device health.

``cycle_metrics`` (every CycleReport, the rest read at scrape time) and
``device_metrics`` (faults and telemetry). Imports the agent and the kit.
"""

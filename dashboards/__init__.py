"""Grafana dashboards, built with Grafana's Python SDK into the chart's committed JSON."""

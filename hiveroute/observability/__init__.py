"""Observability: Prometheus metrics, traces, dashboards."""

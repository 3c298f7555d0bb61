"""Grafana dashboards and alert rules as code."""

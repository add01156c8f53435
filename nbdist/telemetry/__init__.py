"""Metric events and the Run store."""

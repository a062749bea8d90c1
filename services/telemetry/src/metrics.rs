//! Prometheus metrics: the `/metrics` endpoint and shared helpers.

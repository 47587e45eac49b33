"""The run's metrics for Prometheus: their names (names), the exporter that
observes the controller and reads the logbook (exporter), the HTTP endpoint
the driver serves them on (server), and the Grafana dashboard built from the
same names (dashboard). docs/metrics.md lists every metric."""

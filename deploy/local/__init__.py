"""The embedded local stack: tansu (Kafka protocol), Prometheus and Alertmanager as plain processes."""

"""The embedded local stack: Apache Kafka, Prometheus and Alertmanager as plain processes on 127.0.0.1."""

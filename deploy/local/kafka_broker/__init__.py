"""A small Kafka-protocol broker that keeps its topics, records and committed offsets in files.

The embedded stack's durable broker: one node, one process, no replication. Records are appended to one file per
partition before a produce is acknowledged, committed offsets to an append-only file, so a broker killed and
started again on the same directory has every acknowledged record and commit. The wire protocol (requests and
responses of every version) comes from kafka-python's schema-driven classes; this package adds the storage, the
consumer-group coordinator and the request handlers. Not a production broker: use Apache Kafka there.
"""

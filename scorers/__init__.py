"""convowatch's scoring library: judges, rubric sets, calibration, metrics.

A plain library: no Kafka, no ClickHouse. Usable from a notebook.
"""

"""convowatch's streaming service and CLI (wires scorers/ and dashboards/)."""

"""What starts convowatch's infrastructure: the embedded local stack and the production stack."""

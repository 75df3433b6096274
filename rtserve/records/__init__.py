"""Records: every answered or rejected request kept, from the worker's spool to Cassandra, looked up by id."""

"""Records: every answered or rejected request kept, from the worker's spool to Apache Cassandra, and looked up by id."""

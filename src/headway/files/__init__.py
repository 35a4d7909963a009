"""Reading and writing headway's files (workloads, schemas); the I/O edge of the core."""

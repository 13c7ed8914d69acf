"""Spark jobs over the share-state log (`spool compact`, `spool audit`).

`segments` lists and decodes closed segments (pure functions that run on executors),
`compact` folds them into one snapshot per key, `adopt` swaps the output in. pyspark is
imported only by the functions that need a session, so the broker can import `adopt`
without it.
"""

"""Share-group serving on the broker: share-partition leader, share sessions."""

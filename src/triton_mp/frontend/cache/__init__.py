"""The response cache: its step in the submit path and the Redis store."""

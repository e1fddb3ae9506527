"""The job's lifecycle events and their consumers."""

"""Worker output: pipes read line by line into console and per-rank file sinks."""

"""Worker output: pipes and terminals read as they come into the console, per-rank files and report tails."""

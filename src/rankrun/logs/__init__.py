"""Worker output: pipes and terminals read as they come into the console, per-rank files and report tails.

``routes`` decides where each worker stream goes (pure), ``pump`` moves one stream to its sinks as it comes,
``console`` writes the launcher's stdout and stderr (destinations, open lines, writer threads), ``lines`` is the pure
byte handling (the rank prefix, partial lines, a tail), ``layout`` the per-run log directory in torchrun's layout, and
``stale`` the owner stamp of a private one, and the sweep of those whose launcher died with its watchdog."""

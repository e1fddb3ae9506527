"""A stuck job explains itself: every worker's stacks on request, grouped into one report (``report``)."""

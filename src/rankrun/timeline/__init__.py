"""``python -m rankrun.timeline EVENTS... -o OUT.html``: one self-contained page drawing a job from its nodes' event files.

``read`` checks the files against schema version 1, ``layout`` turns the events into lanes, bars and marks (pure), and
``render`` writes them as HTML with inline SVG. Nothing of the launcher is imported: the event files are the only input.
"""

"""``python -m rankrun.timeline EVENTS... -o OUT.html``: one self-contained page drawing a job from its nodes' event files.

``read`` checks the files against schema version 1 (the keys and their types as ``rankrun.events``' JSON Schema lists
them), ``layout`` turns the events into lanes, bars and marks (pure), and ``render`` writes them as HTML with inline
SVG. Of the launcher only ``rankrun.events`` (the schema) and ``rankrun.errors`` are imported: the event files are the
only input.
"""

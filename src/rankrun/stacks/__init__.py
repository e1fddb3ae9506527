"""A stuck job explains itself: every worker's stacks on request, grouped into one report (``report``).

``channel`` sets up what a worker is given to answer with its stacks (the ``shim/`` first on its ``PYTHONPATH``),
``sampler`` asks the workers and reads their answers, ``dump`` parses one (pure), ``control`` is ``rankrun --stacks``'s
socket and client, ``exchange`` gathers the whole job's report through the rendezvous store in the records of
``wire``, and ``flight`` takes torch's Flight Recorder's dumps at a stall."""

"""The agent. One node: its restart loop (``loop``: plan → env → worker group → decide → report). Several nodes: their
own loop of rounds (``multinode``), inside a rendezvous session (``rendezvous.session``), where the coordinator decides
each round (``rendezvous.round``, with the same ``policy.decide``). Either way, each attempt is ``attempt``.

Around them: ``deps`` (the seams the agent acts through), ``plan`` (one attempt's plan, pure), ``ranks`` (the workers'
identities, pure), ``env`` (a worker's torchrun variables, pure), ``race`` (racing awaitables). A round's seam is
``round`` (``RoundWatch``); its features are listed in ``features``, with ``gate`` (``--health-check``) and ``store_relay``
(``--store-relays``). An attempt's seam is ``watch`` (``AttemptWatch``); its observers are ``stall``
(``--hang-timeout``), ``startup`` (the start-up timeline), ``stragglers/`` (``--straggler-window``: the attempt's
watch; several nodes' round adds the job's, ``JobView``'s) and ``training`` (the first collective, with that watch).
The job's event stream: ``facts`` (the lifecycle facts,
pure), ``observers`` (the consumers the options ask for, and the goodput account the job always keeps: ``goodput``),
``lines`` (the console's lines that say a fact). The job's
preloading process (``--preload``), from its start to its end and its events: ``preload``. Kept progress
(``rankrun.checkpoint``): the node's keeper for the job's length, and each attempt's part: ``checkpoint``."""

"""The straggler watch's parts (``--straggler-window``): what the workers record of their collectives' arrivals
(``frfile``), the clock offsets between agents (``clock``), the verdict rule (``verdict``), and one node's window as
it goes to the host, and their merge (``summary``), as pure functions of what the agent samples. Below the agent and
the rendezvous, which hand them what they judge; from the leaves only."""

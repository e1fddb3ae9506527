"""``--numa-binding``: which CPUs each local rank may run on, from its GPU's place in the machine (torch 2.13's
``torch/numa/binding.py`` semantics, without torch): the machine's layout is read by ``topology``, the CPUs each
rank gets are decided by ``binding`` (pure), and the spawner applies them to the worker before it runs."""

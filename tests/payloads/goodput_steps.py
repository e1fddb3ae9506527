"""A training script whose time is known, for the goodput account (``tests/e2e/test_goodput_gloo.py``).

Each rank sleeps ``SLEEP`` s before ``init_process_group`` (a start-up of known length), then runs steps 1..``STEPS``
of ~``STEP`` s each, every one ending in an all-reduce, and keeps its progress with ``rankrun.checkpoint`` every
``KEEP`` steps. Rank ``KILL_RANK`` SIGKILLs itself at the start of step ``KILL_AT`` of attempt 0. A restart resumes from
the kept step. Each rank writes ``$OUT/<rank>.<attempt>.json``: by the wall clock, when its first all-reduce began,
when each kept step's save was called and returned, when it was about to kill itself, and when it ended.
"""

import json
import os
import signal
import time

import torch
import torch.distributed as dist

import rankrun.checkpoint


def main() -> None:
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    steps, every, length = int(os.environ.get("STEPS", "20")), int(os.environ.get("KEEP", "5")), float(os.environ.get("STEP", "0.2"))
    out = os.path.join(os.environ["OUT"], f"{rank}.{attempt}.json")
    kept = rankrun.checkpoint.load()
    first = kept[0] + 1 if kept is not None else 1
    time.sleep(float(os.environ.get("SLEEP", "1.5")))
    dist.init_process_group("gloo")
    facts: dict[str, object] = {"resumed": first - 1, "saved": {}}
    grad = torch.ones(4)
    for step in range(first, steps + 1):
        if attempt == 0 and rank == int(os.environ.get("KILL_RANK", "-1")) and step == int(os.environ["KILL_AT"]):
            facts["killed"] = time.time()
            with open(out, "w") as fh:
                json.dump(facts, fh)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(length)
        facts.setdefault("first_collective", time.time())
        dist.all_reduce(grad)
        if step % every == 0:
            facts.setdefault("saving", {})[step] = time.time()  # type: ignore[index]
            rankrun.checkpoint.save(step, {"grad": grad})
            facts["saved"][step] = time.time()  # type: ignore[index]
    facts["ended"] = time.time()
    with open(out, "w") as fh:
        json.dump(facts, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

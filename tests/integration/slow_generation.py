"""An ``asyncrl`` command whose llm generations are slowed artificially, for the heartbeat test
(test_generator_heartbeats.py). Started as a ``Procs.start`` prefix: ``python slow_generation.py SECONDS``
followed by ``python -m asyncrl.cli ARGS``; every call of the sampler's ``generate_group`` first
waits SECONDS (in steps of 0.05 s, each one a decoding step's ``on_step``, so a cancel still ends
it), then generates as usual. Nothing else changes."""

from __future__ import annotations

import sys
import time


def main() -> None:
    seconds = float(sys.argv[1])
    args = sys.argv[sys.argv.index("asyncrl.cli") + 1 :]

    from asyncrl.tasks.llm import sampling

    real = sampling.generate_group

    def slow(*a, on_step=None, **kw):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if on_step is not None:
                on_step()
        return real(*a, on_step=on_step, **kw)

    sampling.generate_group = slow
    sys.argv = ["asyncrl", *args]
    from asyncrl.__main__ import main as asyncrl_main

    asyncrl_main()


if __name__ == "__main__":
    main()

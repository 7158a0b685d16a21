"""One role (a learner of hostile_helpers.SMALL, or a broadcaster holding weights of --weights-bytes)
served in its own process, so that the resource tests measure its RSS alone
(test_hostile_resources.py). Started as ``python hostile_role.py ROLE --run-dir D [--nofile N]
[--keys DIR]``; prints one JSON line {"endpoint", "pid", "shm"} once it serves, then serves until
SIGTERM (closes the role: its shared-memory segment is removed) or until --max-s seconds passed."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # slot_examples
sys.path.insert(0, str(Path(__file__).resolve().parent))  # hostile_helpers

import numpy as np  # noqa: E402
from hostile_helpers import SMALL as HOSTILE_SMALL  # noqa: E402

from asyncrl.core import config  # noqa: E402
from asyncrl.run.launch import free_port_pair  # noqa: E402
from asyncrl.wire import codec, sockets  # noqa: E402
from asyncrl.wire.security import Security  # noqa: E402

# the learner of the hostile tests, quiet and never finishing on its own
SMALL = [*HOSTILE_SMALL, "run.log_every_s=100000", "run.total_env_steps=1000000000"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("learner", "broadcaster"))
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--nofile", type=int, default=0, help="RLIMIT_NOFILE (soft and hard) to serve under")
    ap.add_argument("--keys", help="server keys directory: bind 0.0.0.0 with CURVE")
    ap.add_argument("--weights-bytes", type=int, default=4 << 20)
    ap.add_argument("--max-s", type=float, default=300.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    host = "0.0.0.0" if args.keys else "127.0.0.1"
    security = Security(args.role, args.keys) if args.keys else None
    shm = None
    if args.role == "learner":
        from asyncrl.roles.learner import Learner

        cfg = config.load(None, SMALL)
        role = Learner(
            cfg,
            Path(args.run_dir),
            run_id=f"res{os.getpid()}",
            bind=f"tcp://{host}:0",
            broadcaster=f"tcp://127.0.0.1:{free_port_pair()}",
            echo=lambda *_: None,
            security=security,
        )
        endpoint, shm = role.endpoint, role.ring.name
    else:
        from asyncrl.roles.broadcaster import Broadcaster

        role = Broadcaster(
            f"tcp://{host}:{free_port_pair()}",
            security=security,
            echo=lambda *_: None,
            max_weights_bytes=args.weights_bytes,
        )
        role.take(
            codec.encode_weights(
                run_id="res",
                epoch=2**62,
                version=1,
                publish_time=0.0,
                layout_hash="h",
                payload=np.ones(args.weights_bytes // 4, np.float32),
            )
        )
        endpoint = sockets.endpoint_of(role.router)
    if args.nofile:  # after start-up: the flood, not the role's own files, meets the limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
    print(
        json.dumps({"endpoint": endpoint.replace("0.0.0.0", "127.0.0.1"), "pid": os.getpid(), "shm": shm}), flush=True
    )
    deadline = time.monotonic() + args.max_s
    try:
        while not stop and time.monotonic() < deadline:
            role.serve(50)
    finally:
        role.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

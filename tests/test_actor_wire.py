"""An actor survives undecodable messages from the learner's and the broadcaster's sockets."""
import numpy as np

from asyncrl import config
from asyncrl import transport as tp
from asyncrl.lag_control import WeightHistory
from asyncrl.roles.actor import Actor, ActorOptions


def test_bad_weights_and_escaped_printing_never_raise():
    cfg = config.load(None, ["env.id=asyncrl/Corridor-v0", "env.num_envs=2"])
    actor = Actor(cfg, ActorOptions(learner="tcp://127.0.0.1:9", broadcaster="tcp://127.0.0.1:11", actor_id="t"))
    try:
        actor.run_id, actor.layout_hash, actor.history, actor.epoch = "r", "h", WeightHistory(), 0
        actor.num_params = 4
        good = tp.encode_weights(run_id="r", version=3, publish_time=1.0, layout_hash="h",
                                 payload=np.ones(4, np.float32))
        for bad in ([b"weights", b"\xc1junk", b"x"], [b"weights", good[1], b"\0" * 3],
                    tp.encode_weights(run_id="other", version=9, publish_time=1.0, layout_hash="h",
                                      payload=np.ones(4, np.float32)),
                    # the right layout hash but another size: policy.load would raise on it
                    tp.encode_weights(run_id="r", version=9, publish_time=1.0, layout_hash="h",
                                      payload=np.ones(5, np.float32))):
            actor._receive(bad)
        assert actor.rejects.by_reason() == {"malformed": 1, "frame_size": 2, "run_id": 1}
        # weights of another learner epoch (an old or a newer learner) are not this session's
        actor._receive(tp.encode_weights(run_id="r", epoch=7, version=5, publish_time=1.0, layout_hash="h",
                                         payload=np.ones(4, np.float32)))
        assert actor.history.newest == -1
        actor._receive([bytes(f) for f in good])
        assert actor.history.newest == 3
    finally:
        actor.close()
    assert tp.printable("a\nb\x1b[31m\u2028") == "a\\nb\\x1b[31m\\u2028"
    assert tp.printable(b"\xff\n") == "\\\\xff\\n" and tp.printable("x" * 500, 10) == "x" * 10 + "..."

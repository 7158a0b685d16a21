"""Control tasks (gymnasium, MuJoCo): :class:`ControlTask` and :class:`ControlProducer`."""
from .task import ControlProducer, ControlTask

__all__ = ["ControlProducer", "ControlTask"]

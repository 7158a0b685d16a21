"""Control tasks (gymnasium, MuJoCo): :class:`ControlTask` and :class:`ControlProducer`."""

from asyncrl.tasks.control.task import ControlProducer, ControlTask

__all__ = ["ControlProducer", "ControlTask"]

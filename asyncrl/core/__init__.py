"""The learner's core, the same for every task kind: configuration, slot specs, learner state,
the consumer of slots, lag accounting, metrics and provenance. It never imports a task, the wire
(zmq, /dev/shm), gymnasium, transformers or Ray."""

"""Size limits that the wire enforces and the configuration must respect, kept free of imports so
that the config can check them without importing the transport."""

MAX_STR_BYTES = 4096  # of any one string in a message header; the learner's welcome carries the config as one

"""``python -m asyncrl``: the same command line as ``asyncrl``."""
from .cli import main

main(prog_name="asyncrl")

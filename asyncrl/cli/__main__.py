"""``python -m asyncrl.cli ARGS``: the same as ``python -m asyncrl ARGS`` (which defers stop signals
from its very start, before this package's imports)."""

from asyncrl.__main__ import main

main()

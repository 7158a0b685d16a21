"""``python -m asyncrl.cli ARGS``: the ``asyncrl`` command (how launchers and studies start roles and runs)."""
from . import main

main()

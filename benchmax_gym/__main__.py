"""``python -m benchmax_gym`` is the ``benchmax-gym`` command."""

import sys

try:  # Ctrl-C while the command's module imports: the same one line and status 130 as main's
    from benchmax_gym.cli import console
except KeyboardInterrupt:
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)

console()

"""``python -m benchmax_gym`` is the ``benchmax-gym`` command."""

import sys

from benchmax_gym.cli import main

sys.exit(main())

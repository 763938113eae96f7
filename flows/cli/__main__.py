"""``python -m flows.cli``: the ``rollflow`` command (``flows.cli.app.main``)."""

import sys

from flows.cli.app import main

sys.exit(main())

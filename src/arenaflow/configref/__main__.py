"""python -m arenaflow.configref: arenaflow.configref.document's command line."""

import sys

from arenaflow.configref.document import main

sys.exit(main())

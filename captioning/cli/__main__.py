"""``python -m captioning.cli ...`` = ``captioning ...``."""

import sys

from captioning.cli.main import main

sys.exit(main())

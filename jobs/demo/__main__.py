"""`python -m jobs.demo`: the same as `coordinator demo`."""

import sys

from jobs.demo.cli import main

sys.exit(main())

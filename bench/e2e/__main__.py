"""`python -m bench.e2e`: the end-to-end benchmark's command line (`bench.e2e.bench.main`)."""

import sys

from bench.e2e.bench import main

sys.exit(main())

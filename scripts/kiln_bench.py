"""`python -m kiln.bench` from a script file, as scripts/bench.sh runs it: under `python -m` the
frames of runpy have no source, and mindspore.jit(capture_mode="trace") reads the source of every
caller frame (its row fails there); from a file every frame has its source."""
import sys

from kiln.bench import main

sys.exit(main())

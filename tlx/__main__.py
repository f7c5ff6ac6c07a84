import sys

from tlx.cli import main

sys.exit(main())

import sys

from fedhet.cli import main

sys.exit(main())

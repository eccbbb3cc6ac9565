import sys

from reasonrl.cli import main

sys.exit(main())

import sys

from grpokit.cli.main import main

sys.exit(main())

import sys

from batchyard.node.launcher import main

sys.exit(main())

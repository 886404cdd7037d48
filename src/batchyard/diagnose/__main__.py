import sys

from batchyard.diagnose.probe import main

sys.exit(main())

import sys

from batchyard.server.main import main

sys.exit(main())

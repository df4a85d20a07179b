import sys

from celerity_jax.cli import main

sys.exit(main())

"""`python -m data_gen.synthetic`: see `data_gen.synthetic.cli`."""

import sys

from data_gen.synthetic.cli import main

if __name__ == "__main__":
    sys.exit(main())

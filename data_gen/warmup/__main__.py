"""`python -m data_gen.warmup`: see `data_gen.warmup.cli`."""

from data_gen.warmup.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

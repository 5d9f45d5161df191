"""Run the command line: ``python -m seqbal plan ...`` (same as the ``seqbal`` console script)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

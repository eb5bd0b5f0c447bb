"""``python -m lake_query``: the same as ``lake query``."""

from lake_query.cli import main

if __name__ == "__main__":
    main()

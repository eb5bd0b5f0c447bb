"""``python -m lake_metasrv --addr ... --data-dir ...``: same as ``lake meta``."""

from lake_metasrv.cli import meta

if __name__ == "__main__":
    meta(prog_name="lake meta")

"""``python -m sqlsdc.cli``."""

from sqlsdc.cli.main import main

main()

"""Command-line interface (installed as ``sqlsdc.cli``)."""

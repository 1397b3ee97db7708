"""DuckDB Python UDFs (installed as ``sqlsdc.udfs``), only for what SQL cannot do.

The threshold baseline needs none; mechanisms that do (e.g. DP samplers) register theirs here.
"""

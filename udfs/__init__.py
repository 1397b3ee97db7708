"""DuckDB Python UDFs (installed as ``sqlsdc.udfs``): only for what SQL cannot do. None are needed by the threshold baseline."""

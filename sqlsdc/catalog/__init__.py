"""The ``sqlsdc`` catalog schema inside the protected database."""

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.setup import ApplyReport, apply_policy, init

__all__ = ["CATALOG_SCHEMA", "ApplyReport", "apply_policy", "init"]

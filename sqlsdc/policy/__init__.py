"""Policy model and loading (validated against ``schemas/policy.schema.json``)."""

from sqlsdc.policy.load import load_policy
from sqlsdc.policy.model import (
    AggregateKind,
    Budget,
    Column,
    ColumnRole,
    DpSettings,
    GroupKeys,
    MagnitudeCkm,
    Method,
    Policy,
    ProtectionRule,
    PTableSpec,
    Rounding,
    SecondaryMethod,
    Suppression,
    Table,
    TableKind,
    User,
    UserRole,
)
from sqlsdc.policy.validate import policy_schema, validate_document

__all__ = [
    "AggregateKind",
    "Budget",
    "Column",
    "ColumnRole",
    "DpSettings",
    "GroupKeys",
    "MagnitudeCkm",
    "Method",
    "Policy",
    "PTableSpec",
    "ProtectionRule",
    "Rounding",
    "SecondaryMethod",
    "Suppression",
    "Table",
    "TableKind",
    "User",
    "UserRole",
    "load_policy",
    "policy_schema",
    "validate_document",
]

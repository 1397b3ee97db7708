"""Policy model and loading (validated against ``schemas/policy.schema.json``)."""

from sqlsdc.policy.load import load_policy, policy_schema, validate_document
from sqlsdc.policy.model import (
    AggregateKind,
    Column,
    ColumnRole,
    MagnitudeCkm,
    Method,
    Policy,
    ProtectionRule,
    PTableSpec,
    SecondaryMethod,
    Suppression,
    Table,
    TableKind,
    User,
    UserRole,
)

__all__ = [
    "AggregateKind",
    "Column",
    "ColumnRole",
    "MagnitudeCkm",
    "Method",
    "Policy",
    "PTableSpec",
    "ProtectionRule",
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

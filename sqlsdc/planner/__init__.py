"""The cell model: classify and check an analyst's query, prove its joins repeat no confidential
row, and plan its protected cells (keys, aggregates in normal form, units, the mechanism).

Pure functions on sqlglot trees and the policy: no database. The guard (``sqlsdc.guard``) drives
these steps and the rewrite (``sqlsdc.rewrite``) consumes the plan; both import this package,
which imports neither.
"""

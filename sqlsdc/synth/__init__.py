"""Synthetic data: synthesis jobs, utility and disclosure measures, and the verification server."""

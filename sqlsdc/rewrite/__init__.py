"""rewrite."""

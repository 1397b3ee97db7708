"""sqlsdc: statistical disclosure control in SQL."""

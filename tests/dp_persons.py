"""The policy of the small DP ``persons`` table (``pid``, ``region``, ``age``) that the
concurrency and charge-fault tests build: each COUNT and SUM spends ε = 1/2, and the analyst
``ana`` has ``budget`` to spend."""


def document(budget) -> dict:
    return {
        "tables": {
            "persons": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "region": {"role": "dimension", "domain": ["N", "S", "E", "W"]},
                    "age": {"role": "dimension"},
                },
                "protection": {
                    "counts": {"method": "dp", "spend": {"epsilon": "1/2"}},
                    "magnitudes": {"method": "dp", "spend": {"epsilon": "1/2"}},
                },
            },
        },
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "ana", "epsilon": str(budget)}],
    }

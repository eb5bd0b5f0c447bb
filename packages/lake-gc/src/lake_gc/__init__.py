"""Lake's managed-object garbage collection worker (plan, then apply)."""

__all__: list[str] = []

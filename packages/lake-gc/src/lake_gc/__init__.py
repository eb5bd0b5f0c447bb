"""Lake's managed-object garbage collection worker: plan, then apply.

``lake gc`` reads reference-delta sidecars (never table rows) and the
registry's roots, inventories the managed stage, and writes an immutable,
content-addressed plan; only ``--apply`` deletes, exactly that plan's
candidates, resumably. See docs/gc.md.
"""

from lake_gc.apply import ApplyResult, Checkpoint, apply_plan
from lake_gc.plan import Plan, PlanManifest, load_plan, make_plan
from lake_gc.target import GcTarget

__all__ = [
    "ApplyResult",
    "Checkpoint",
    "GcTarget",
    "Plan",
    "PlanManifest",
    "apply_plan",
    "load_plan",
    "make_plan",
]

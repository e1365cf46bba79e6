"""``switchboard bench``: measure every backend that is valid on this pod, on its own GPU.

Why: static priority lists are guesses frozen in code; the fleet's own GPUs can say
which MLA prefill kernel is fastest for the model it really serves. The bench runs
every backend the torch-free specs accept for this pod (probed capability, packages
that really import, the model's dims and dtype) on a few representative prefill
shapes with the model's own head count, and reports each result with the exact
situation the service keys its evidence by, the serving engine and the code path.

Three steps, one module each:

* :mod:`.plan`: what to run (backends, shapes, layers, budget), all input checked;
* :mod:`.run`: correctness first, then speed as serving calls the kernel, in budget;
* :mod:`.report`: the ``POST /v1/measurements`` body, its delivery, table and JSON;

and :mod:`.child` runs the whole bench in a bounded child process for
``select --measure``. Importing this package does not import torch.
"""

from mla_switchboard.agent.bench.child import measure_in_child
from mla_switchboard.agent.bench.plan import (
    CHECK_CASES,
    DEFAULT_CPU_SHAPES,
    DEFAULT_GPU_SHAPES,
    BenchPlan,
    BenchShape,
    CheckCase,
    log_plan,
    parse_shapes,
    plan_bench,
)
from mla_switchboard.agent.bench.report import (
    ReportStatus,
    build_report,
    deliver,
    format_table,
    to_document,
)
from mla_switchboard.agent.bench.run import (
    BenchInterrupted,
    BenchOutcome,
    CheckOutcome,
    ShapeResult,
    Skip,
    interruptible,
    iterations,
    run_bench,
    time_forward_passes,
)

__all__ = [
    "CHECK_CASES",
    "DEFAULT_CPU_SHAPES",
    "DEFAULT_GPU_SHAPES",
    "BenchInterrupted",
    "BenchOutcome",
    "BenchPlan",
    "BenchShape",
    "CheckCase",
    "CheckOutcome",
    "ReportStatus",
    "ShapeResult",
    "Skip",
    "build_report",
    "deliver",
    "format_table",
    "interruptible",
    "iterations",
    "log_plan",
    "measure_in_child",
    "parse_shapes",
    "plan_bench",
    "run_bench",
    "time_forward_passes",
    "to_document",
]

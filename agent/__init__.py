"""The GPU-side agent: describe the pod, ask the service, fail static, build the kernel.

``from agent import select_backend`` is the Python API; ``switchboard select`` the
CLI (``agent.cli.select_main``). Importing this package never imports torch: the
probe and the kernel build import it when they run.
"""

from mla_switchboard.agent.api import SelectionResult, select_backend
from mla_switchboard.agent.errors import AgentError, BadInputError, KernelBuildError, NoBackendError

__all__ = [
    "AgentError",
    "BadInputError",
    "KernelBuildError",
    "NoBackendError",
    "SelectionResult",
    "select_backend",
]

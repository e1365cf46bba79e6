"""The GPU-side agent: describe the pod, ask the service, fail static, build the kernel.

``from mla_switchboard.agent import PodSpec, select_backend`` is the Python API;
``switchboard select`` the CLI (``mla_switchboard.agent.commands.select``). Importing
this package never imports torch (the probe and the kernel build import it when they
run) nor anything from the service (a GPU pod's plain install has none of it).
"""

from mla_switchboard.agent.api import SelectionResult, select_backend
from mla_switchboard.agent.errors import AgentError, BadInputError, KernelBuildError, NoBackendError
from mla_switchboard.agent.pod import PodSpec

__all__ = [
    "AgentError",
    "BadInputError",
    "KernelBuildError",
    "NoBackendError",
    "PodSpec",
    "SelectionResult",
    "select_backend",
]

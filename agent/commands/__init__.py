"""The agent's command line, one job per module.

``parsing`` reads flags into a :class:`~mla_switchboard.agent.pod.PodSpec`; ``select``
and ``bench`` are the two commands; ``formats`` prints the answer's own document as
``--format`` asks. Which serving engine the pod runs is decided in one place,
:mod:`mla_switchboard.agent.engine`. The ``switchboard`` program itself, which also
offers the service's commands where the server extra is installed, is
``mla_switchboard.cli``; nothing here knows about the service.

The package imports none of its modules, so that ``python -m
mla_switchboard.agent.commands.bench`` (how ``select --measure`` starts its child)
runs the module once, as ``__main__``.
"""

"""The neutral decision core: what every other part of MLA Switchboard stands on.

It imports neither torch nor FastAPI nor SQLAlchemy (only pydantic), so the service, its
preview and regret, the dashboard data and the GPU pod's agent all call one evaluator
with the same inputs:

- ``specs``: the backend table and ``reasons_invalid`` for a situation;
- ``schemas``: the wire contract of ``/v1/select`` and friends;
- ``evidence``: measured evidence per situation and how it ranks backends;
- ``evaluator``: the pure decision (deny > force > request > measured > priority).
"""

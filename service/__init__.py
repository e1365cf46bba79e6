"""MLA Switchboard's central service.

Importing ``service`` or ``mla_switchboard.core.evaluator`` stays light (pydantic and the torch-free
kernel specs only): the agent imports the decision engine for its local fallback, and a
GPU pod must not need FastAPI or SQLAlchemy for that. The HTTP app lives in
``service.api`` and storage in ``service.store``.
"""

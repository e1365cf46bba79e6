"""Measured evidence in the service: whose evidence a decision trusts (``trust``) and
how each replica keeps its indexes current off the event loop (``sync``)."""

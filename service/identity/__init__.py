"""Who is calling: people (OIDC sign-in, sessions), pods (workload tokens verified
against their cluster's issuer keys), static tokens, and the throttle that slows down
callers that keep failing to prove who they are. Everything else in the service
receives a verified ``Principal`` from here and never looks at credentials itself.
"""

# MLA Switchboard service image: no torch, no GPU libraries, runs as uid 10001.
#   podman build --format docker -t mla-switchboard .     (or docker build)
#   podman run -p 8000:8000 -v sb-data:/data mla-switchboard
# Another port: -e SWITCHBOARD_PORT=9000 (the server and the HEALTHCHECK both read it).
# PostgreSQL instead of the embedded SQLite file:
#   podman run -e SWITCHBOARD_DATABASE_URL=postgresql+psycopg://user@db/switchboard ...
# CI builds and runs it: .ci/image.sh.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# The service and its dependencies go into one venv, the only thing the final stage
# copies: no wheels, no pip cache, no build tree left in a layer.
RUN python -m venv /opt/switchboard
WORKDIR /src
COPY .ci/constraints.txt ./constraints.txt
COPY pyproject.toml README.md ./
COPY core ./core
COPY service ./service
COPY kernels ./kernels
COPY agent ./agent
COPY cli ./cli
# The same pins as the tests (.ci/constraints.txt); non-editable, so the venv holds a
# complete copy of the package and nothing points back into /src.
# pip and setuptools are build tools: the running service needs neither (25 MB).
RUN /opt/switchboard/bin/pip install -c constraints.txt ".[server]" \
    && /opt/switchboard/bin/pip uninstall --yes pip setuptools

FROM python:3.11-slim
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWITCHBOARD_DATABASE_URL=sqlite:////data/switchboard.db \
    SWITCHBOARD_HOST=0.0.0.0 \
    SWITCHBOARD_PORT=8000
RUN groupadd --gid 10001 switchboard \
    && useradd --create-home --uid 10001 --gid 10001 switchboard \
    && mkdir /data && chown 10001:10001 /data
COPY --from=build /opt/switchboard /opt/switchboard
# numeric, so that Kubernetes' runAsNonRoot can check it without /etc/passwd
USER 10001:10001
WORKDIR /home/switchboard
VOLUME ["/data"]
EXPOSE 8000
# `switchboard health` asks /readyz on 127.0.0.1:$SWITCHBOARD_PORT, the port serve listens
# on; called through its module, which skips loading the agent (0.1 s instead of 0.8 s)
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-m", "mla_switchboard.service.cli", "health"]
ENTRYPOINT ["switchboard"]
# --host and --port default to $SWITCHBOARD_HOST and $SWITCHBOARD_PORT
CMD ["serve"]

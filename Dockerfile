# MLA Switchboard service image: no torch, no GPU libraries, runs as non-root.
#   docker build -t mla-switchboard .
#   docker run -p 8000:8000 -v sb-data:/data mla-switchboard
# PostgreSQL instead of the embedded SQLite file:
#   docker run -e SWITCHBOARD_DATABASE_URL=postgresql+psycopg://user@db/switchboard ...

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY kernels ./kernels
COPY agent ./agent
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWITCHBOARD_DATABASE_URL=sqlite:////data/switchboard.db
RUN groupadd --gid 10001 switchboard \
    && useradd --create-home --uid 10001 --gid 10001 switchboard \
    && mkdir /data && chown 10001:10001 /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# numeric, so that Kubernetes' runAsNonRoot can check it without /etc/passwd
USER 10001:10001
WORKDIR /home/switchboard
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
ENTRYPOINT ["switchboard"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

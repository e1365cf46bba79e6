"""shapes, stage buckets and fleet counts: fleet reads that grow with situations

Create Date: 2026-12-01 08:00:00

A decision stores its request's shape (everything but cluster, node and pod) once
per distinct shape; ``pod_latest`` gains each pod's shape and stage bucket; and
``fleet_counts`` holds how many pods' newest decision is in each (cluster, shape,
backend, source) group, per stage bucket, which the decision writer keeps in step.
The upgrade fills both from the pods' newest decisions once (O(pods), here only);
older decisions keep their request text and are read as before.

What a shape and a stage bucket were when this revision was written is copied here
(``_shape_of_json``, ``_stage_bucket``), frozen: a migration must fill the same rows
whatever the live code later makes of them.
"""

import hashlib
import json
from collections import defaultdict

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0005"
down_revision = "0004"

STAGE_BUCKETS = 100
NAMING_FIELDS = frozenset({"cluster", "node", "pod"})


def _stage_bucket(cluster: str, pod: str | None) -> int | None:
    """A named pod's stage bucket: a stable hash of (cluster, pod name)."""
    if not pod:
        return None
    digest = hashlib.blake2b(f"{cluster}\0{pod}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STAGE_BUCKETS


def _shape_of_json(request_json: str) -> tuple[str, str]:
    """(id, canonical JSON) of a stored request's shape: everything but its naming
    fields, sorted keys; text that is no JSON object is kept whole."""
    try:
        body = json.loads(request_json)
    except ValueError:
        body = None
    if isinstance(body, dict):
        shape = {k: v for k, v in body.items() if k not in NAMING_FIELDS}
    else:
        shape = {"unparsed": request_json}
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest(), text


def upgrade() -> None:
    op.create_table("shapes", *columns.content_addressed("request"))
    op.create_table(
        "fleet_counts",
        columns.cluster(),
        columns.content_id("shape_id"),
        *columns.choice(),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("buckets", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "shape_id", "backend", "source"),
    )
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column("request", existing_type=sa.Text(), nullable=True)
        batch.add_column(columns.content_id("shape_id", nullable=True))
        batch.create_index("ix_decisions_cluster_pod_id", ["cluster", "pod", "id"])
    with op.batch_alter_table("pod_latest") as batch:
        batch.add_column(columns.content_id("shape_id", nullable=True))
        batch.add_column(sa.Column("bucket", sa.Integer(), nullable=True))
    with op.batch_alter_table("meta") as batch:
        batch.alter_column("value", existing_type=sa.Integer(), type_=sa.BigInteger())
    _fill()


def _fill() -> None:
    conn = op.get_bind()
    shapes: dict[str, str] = {}
    pods: list[dict[str, object]] = []
    counts: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0] * STAGE_BUCKETS)
    rows = conn.execute(
        sa.text(
            "SELECT p.cluster, p.node, p.pod, p.backend, p.source, d.request "
            "FROM pod_latest p JOIN decisions d ON d.id = p.decision_id"
        )
    )
    for cluster, node, pod, backend, source, request in rows:
        shape_id, shape_json = _shape_of_json(request)
        bucket = _stage_bucket(cluster, pod)
        shapes[shape_id] = shape_json
        pods.append({"c": cluster, "n": node, "p": pod, "s": shape_id, "b": bucket})
        counts[(cluster, shape_id, backend, source)][bucket or 0] += 1
    if shapes:
        conn.execute(
            sa.text("INSERT INTO shapes (id, request) VALUES (:i, :r)"),
            [{"i": k, "r": v} for k, v in shapes.items()],
        )
    if pods:
        conn.execute(
            sa.text(
                "UPDATE pod_latest SET shape_id = :s, bucket = :b "
                "WHERE cluster = :c AND node = :n AND pod = :p"
            ),
            pods,
        )
    if counts:
        conn.execute(
            sa.text(
                "INSERT INTO fleet_counts (cluster, shape_id, backend, source, pods, buckets) "
                "VALUES (:c, :s, :b, :src, :n, :buckets)"
            ),
            [
                {
                    "c": c,
                    "s": s,
                    "b": b,
                    "src": src,
                    "n": sum(v),
                    "buckets": json.dumps(v, separators=(",", ":")),
                }
                for (c, s, b, src), v in counts.items()
            ],
        )
    conn.execute(sa.text("INSERT INTO meta (key, value) VALUES ('fleet_version', 1)"))


def downgrade() -> None:
    with op.batch_alter_table("meta") as batch:
        batch.alter_column("value", existing_type=sa.BigInteger(), type_=sa.Integer())
    with op.batch_alter_table("pod_latest") as batch:
        batch.drop_column("bucket")
        batch.drop_column("shape_id")
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT d.id, d.cluster, d.node, d.pod, s.request FROM decisions d "
            "JOIN shapes s ON s.id = d.shape_id WHERE d.request IS NULL"
        )
    ).all()
    if rows:
        conn.execute(
            sa.text("UPDATE decisions SET request = :r WHERE id = :i"),
            [
                {"i": i, "r": json.dumps({"cluster": c, "node": n, "pod": p, **json.loads(s)})}
                for i, c, n, p, s in rows
            ],
        )
    with op.batch_alter_table("decisions") as batch:
        batch.drop_index("ix_decisions_cluster_pod_id")
        batch.drop_column("shape_id")
        batch.alter_column("request", existing_type=sa.Text(), nullable=False)
    op.drop_table("fleet_counts")
    op.drop_table("shapes")
    op.execute("DELETE FROM meta WHERE key = 'fleet_version'")

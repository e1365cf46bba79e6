"""What the fleet runs, read by group: shapes, the counts by (cluster, shape, stage
class), and the reads built on them (summary, regret, previews, rollout progress)."""

"""The yardstick for bench/select_load.py: a bare ``async def`` FastAPI endpoint that
takes the same request model and returns a constant answer. Whatever /v1/select costs
beyond this is Switchboard's own work (auth, decision, recording, metrics)."""

from __future__ import annotations

from fastapi import FastAPI
from mla_switchboard.core.schemas import SelectRequest

app = FastAPI()
CONSTANT = {"backend": "FLASH_ATTN", "source": "priority"}


@app.post("/v1/select")
async def select(body: SelectRequest) -> dict[str, str]:
    return CONSTANT

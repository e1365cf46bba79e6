"""``GET /v1/backends``: the backend registry as the dashboard and other clients read it."""

from __future__ import annotations

import httpx
from mla_switchboard.core.specs import SPECS, Backend, Dtype


def test_lists_every_backend_in_display_order_with_its_facts(
    shared_inprocess: httpx.Client,
) -> None:
    r = shared_inprocess.get("/v1/backends")
    assert r.status_code == 200, r.text
    backends = r.json()["backends"]
    assert [b["name"] for b in backends] == [b.value for b in Backend]
    assert [b["order"] for b in backends] == list(range(len(Backend)))
    for entry in backends:
        spec = SPECS[Backend(entry["name"])]
        assert entry["colour"] == spec.colour
        assert entry["summary"] == spec.summary
        assert entry["capability"] == spec.capability_text
        assert entry["dims"] == spec.dims_text
        assert set(entry["dtypes"]) == {d.value for d in spec.dtypes}
        assert [p["import_name"] for p in entry["packages"]] == list(spec.package_names)
    tokenspeed = backends[list(Backend).index(Backend.TOKENSPEED_MLA)]
    assert tokenspeed["capability_majors"] == [10]
    assert tokenspeed["allowed_dims"] == [[128, 64, 128]]
    assert {
        "import_name": "tokenspeed_mla",
        "distributions": ["tokenspeed-mla", "tokenspeed_mla"],
    } in tokenspeed["packages"]
    flash_attn = backends[list(Backend).index(Backend.FLASH_ATTN)]
    assert flash_attn["allowed_dims"] is None and flash_attn["max_qk_head_dim"] == 256
    assert [p["import_name"] for p in flash_attn["optional_packages"]] == ["flash_attn"]
    flashinfer = backends[list(Backend).index(Backend.FLASHINFER)]
    assert flashinfer["capability_majors"] == [8, 9, 10, 11, 12]
    assert flashinfer["allowed_dims"] is None
    assert flashinfer["head_dims_by_major"] == {"10": [[64, 64], [128, 128], [192, 128]]}
    trtllm = backends[list(Backend).index(Backend.TRTLLM_RAGGED)]
    assert trtllm["allowed_dims"] is None
    assert trtllm["head_dims_by_major"] == {"10": [[128, 128], [192, 128], [256, 256]]}
    narrowed = (flashinfer, trtllm)
    assert all(b["head_dims_by_major"] == {} for b in backends if b not in narrowed)
    sdpa = backends[list(Backend).index(Backend.TORCH_SDPA)]
    assert sdpa["needs_gpu"] is False and Dtype.FLOAT32.value in sdpa["dtypes"]


def test_needs_a_viewer_token_like_every_read_and_answers_304_to_its_etag(
    shared_inprocess: httpx.Client,
) -> None:
    assert shared_inprocess.get("/v1/backends", headers={"Authorization": ""}).status_code == 401
    for role, status in (("viewer", 200), ("agent", 403)):
        made = shared_inprocess.post(
            "/v1/tokens", json={"name": f"backends-{role}", "role": role, "clusters": None}
        )
        assert made.status_code == 201, made.text
        auth = {"Authorization": f"Bearer {made.json()['token']}"}
        assert shared_inprocess.get("/v1/backends", headers=auth).status_code == status
    first = shared_inprocess.get("/v1/backends")
    etag = first.headers["ETag"]
    again = shared_inprocess.get("/v1/backends", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.headers["ETag"] == etag


def test_the_openapi_document_describes_it(shared_inprocess: httpx.Client) -> None:
    operation = shared_inprocess.get("/openapi.json").json()["paths"]["/v1/backends"]["get"]
    assert "BackendsDocument" in str(operation["responses"]["200"])
    assert {"401", "403"} <= set(operation["responses"])

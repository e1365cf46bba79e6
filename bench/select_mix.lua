-- wrk script: a mix of distinct pods booting (10,000 pod names over 20 clusters),
-- several GPU generations, package sets and the odd requested backend.
local counter = 0
local caps = {"[9,0]", "[9,0]", "[9,0]", "[10,0]", "[8,0]", "null"}
local pkgs = {
  '{"torch":"2.11.0","flashinfer":"0.7.2","cudnn":"1.32.0"}',
  '{"torch":"2.11.0"}',
  'null',
}
local requested = {"null", "null", "null", '"FLASHINFER"'}
local token = os.getenv("SWITCHBOARD_TOKEN") or "bench-admin-token"
-- the path to post to (bench/select_stack.py measures several routes of one server)
local path = os.getenv("SELECT_PATH") or "/v1/select"

request = function()
  counter = counter + 1
  local i = counter % 10000
  local body = string.format(
    '{"cluster":"bench-%d","node":"node-%d","pod":"pod-%d",' ..
    '"device":{"name":"GPU","capability":%s},' ..
    '"model":{"name":"deepseek-ai/DeepSeek-R1","qk_nope_head_dim":128,' ..
    '"qk_rope_head_dim":64,"v_head_dim":128,"num_heads":128},' ..
    '"dtype":"bfloat16","packages":%s,"requested_backend":%s}',
    i % 20, i % 500, i, caps[(i % #caps) + 1], pkgs[(i % #pkgs) + 1],
    requested[(i % #requested) + 1])
  return wrk.format("POST", path,
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}, body)
end

local errors = 0
response = function(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

done = function(summary, latency, requests)
  io.write(string.format(
    'RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,' ..
    '"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end

-- wrk script for rtserve's benchmark: POST one JSON body with an optional bearer token, and
-- print a one-line JSON summary (requests, errors, latency percentiles in microseconds) that
-- bench/perf.py parses. Arguments after `--`: BODY_FILE [TOKEN [CONTENT_TYPE]] (default
-- application/json).
local body_file, token, content_type = nil, nil, nil

function init(args)
  body_file, token, content_type = args[1], args[2], args[3]
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  if not content_type or content_type == "" then
    content_type = "application/json"
  end
  wrk.headers["Content-Type"] = content_type
  if token and token ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. token
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "mean": %.1f, "p50": %d, "p90": %d, "p95": %d, "p99": %d, ' ..
    '"p999": %d, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(95), latency:percentile(99), latency:percentile(99.9), latency.max))
end

-- The wrk script of `python -m bench --http`'s load runs (bench/http_load.py writes its data).
--
--   wrk -t2 -c32 -d10s -s bench/wrk/requests.lua http://127.0.0.1:PORT -- DATA KEYS
--
-- DATA is a Lua chunk returning {mode = "append" | "load" | "head", run = "<hex>", threads = n,
-- authorization = "Bearer ...", paths = {...}, texts = {...}}. Each wrk thread takes every
-- n-th path from its own (thread i the paths i, i + n, ...) and sends to them round robin.
-- An append's body is one user message whose text starts with a marker unique in the run,
-- "<run>-<thread>-<i>", which is also its Idempotency-Key; both servers echo the message in
-- their 201, so response() records the marker of every append answered 2xx. done() prints
-- one JSON line (counts by status, wrk's socket errors, latency percentiles) and writes the
-- acknowledged markers to KEYS, one a line, for the bench to check against the log.
-- A 503 is honoured as a client should honour it: the thread's next request waits its
-- Retry-After (delay() below), so a refused client does not come straight back.

local threads = {}
local next_id = 0

function setup(thread)
   thread:set("id", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

-- each thread's own state (set by init)
local data, requests, mode, marker
local sent = 0
s2xx, s503, s5xx, s4xx, sother, unmatched = 0, 0, 0, 0, 0, 0
acked = {}
retry_after = ""
first_error = ""
-- the refusals of this thread whose Retry-After no request has waited yet, and that wait
local waits, wait_ms = 0, 1000

function init(args)
   data = dofile(args[1])
   keys_path = args[2]
   mode = data.mode
   marker = data.run .. "%-%d+%-%d+"
   requests = {}
   for j = 1, #data.paths do
      if (j - 1) % data.threads == id then
         table.insert(requests, data.paths[j])
      end
   end
   if #requests == 0 then
      requests = data.paths
   end
   if mode ~= "append" then
      -- the same request every time: format it once per path
      local headers = {Authorization = data.authorization}
      for j = 1, #requests do
         requests[j] = wrk.format("GET", requests[j], headers)
      end
   end
end

function request()
   sent = sent + 1
   local path = requests[(sent - 1) % #requests + 1]
   if mode ~= "append" then
      return path
   end
   local key = data.run .. "-" .. id .. "-" .. sent
   local text = data.texts[(sent - 1) % #data.texts + 1]
   local body = '{"messages":[{"role":"user","content":"' .. key .. " " .. text .. '"}]}'
   local headers = {
      Authorization = data.authorization,
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = key,
   }
   return wrk.format("POST", path, headers, body)
end

function response(status, headers, body)
   if status >= 200 and status < 300 then
      s2xx = s2xx + 1
      if mode == "append" then
         local key = string.match(body, marker)
         if key then
            acked[#acked + 1] = key
         else
            unmatched = unmatched + 1
         end
      end
      return
   end
   if status == 503 then
      s503 = s503 + 1
      retry_after = headers["Retry-After"] or headers["retry-after"] or "(none)"
      waits = waits + 1
      wait_ms = 1000 * (tonumber(retry_after) or 1)
   elseif status >= 500 then
      s5xx = s5xx + 1
   elseif status >= 400 then
      s4xx = s4xx + 1
   else
      sother = sother + 1
   end
   if first_error == "" and status ~= 503 then
      first_error = status .. " " .. string.sub(body or "", 1, 300)
   end
end

-- wrk asks before each request how long to wait: a refusal's Retry-After, once. (A thread
-- runs many connections: the wait falls on its next request, not always on the connection
-- refused, so the number of waits is exact and their connections approximate.)
function delay()
   if waits == 0 then
      return 0
   end
   waits = waits - 1
   return wait_ms
end

local function quoted(s)
   s = string.gsub(s, '[%c"\\]', function(c)
      return string.format("\\u%04x", string.byte(c))
   end)
   return '"' .. s .. '"'
end

function done(summary, latency, requests)
   local total = {s2xx = 0, s503 = 0, s5xx = 0, s4xx = 0, sother = 0, unmatched = 0}
   local retry, err, path = "", "", nil
   local out = nil
   for _, thread in ipairs(threads) do
      for name, _ in pairs(total) do
         total[name] = total[name] + thread:get(name)
      end
      if retry == "" then retry = thread:get("retry_after") end
      if err == "" then err = thread:get("first_error") end
      path = path or thread:get("keys_path")
      if path and not out then out = assert(io.open(path, "w")) end
      for _, key in ipairs(thread:get("acked")) do
         out:write(key, "\n")
      end
   end
   if out then out:close() end
   local e = summary.errors
   local fields = {
      string.format('"requests":%d', summary.requests),
      string.format('"duration_us":%d', summary.duration),
      string.format('"connect":%d,"read":%d,"write":%d,"timeout":%d',
                    e.connect, e.read, e.write, e.timeout),
      string.format('"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d',
                    latency:percentile(50), latency:percentile(99),
                    latency:percentile(99.9), latency.max),
      '"retry_after":' .. quoted(retry),
      '"first_error":' .. quoted(err),
   }
   for name, value in pairs(total) do
      fields[#fields + 1] = string.format('"%s":%d', name, value)
   end
   io.write("{", table.concat(fields, ","), "}\n")
end

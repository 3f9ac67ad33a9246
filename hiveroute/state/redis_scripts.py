"""The Lua scripts that make the Redis store's compound operations atomic.

Each runs inside Redis as one command, so no other replica's write lands between its read and
its write: compare-and-set, push-and-trim, the field-wise merge of an outage journal, and the
absent-only restore of a replica's copy into a Redis that lost its data.
"""

from __future__ import annotations

# KEYS[1]; ARGV: expected_present ('1'/'0'), expected, value_present, value, px ('' = no TTL)
COMPARE_AND_SET = """
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if cur ~= ARGV[2] then return 0 end
elseif cur then
  return 0
end
if ARGV[3] ~= '1' then
  redis.call('DEL', KEYS[1])
elseif ARGV[5] ~= '' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
else
  redis.call('SET', KEYS[1], ARGV[4])
end
return 1
"""


def cas_args(expected: str | None, value: str | None, px_ms: int | None) -> list[str]:
    """COMPARE_AND_SET's arguments: set (or with `value` None, delete) if `expected` is held."""
    return [
        "0" if expected is None else "1",
        expected or "",
        "0" if value is None else "1",
        value or "",
        "" if px_ms is None else str(px_ms),
    ]


# KEYS[1]; ARGV: max_len, value... -> the values that fell off the front
PUSH_BOUNDED = """
local n = redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
local excess = n - tonumber(ARGV[1])
if excess > 0 then
  local dropped = redis.call('LRANGE', KEYS[1], 0, excess - 1)
  redis.call('LTRIM', KEYS[1], excess, -1)
  return dropped
end
return {}
"""

# KEYS[1]; ARGV: six per field: op, field, a, b, c, d -> how many writes lost to a conflict
#   op 'i' / 'f': HINCRBY / HINCRBYFLOAT by a
#   op 'c': if the field holds b (a = '1') or is absent (a = '0'), set it to d (c = '1') or
#           delete it (c = '0'); otherwise count a conflict
#   op 'w': the same without the check (last write wins)
MERGE_HASH = """
local conflicts = 0
for i = 1, #ARGV, 6 do
  local op, f = ARGV[i], ARGV[i + 1]
  if op == 'i' then
    redis.call('HINCRBY', KEYS[1], f, ARGV[i + 2])
  elseif op == 'f' then
    redis.call('HINCRBYFLOAT', KEYS[1], f, ARGV[i + 2])
  else
    local ok = true
    if op == 'c' then
      local cur = redis.call('HGET', KEYS[1], f)
      if ARGV[i + 2] == '1' then ok = (cur == ARGV[i + 3]) else ok = (cur == false) end
    end
    if not ok then
      conflicts = conflicts + 1
    elseif ARGV[i + 4] == '1' then
      redis.call('HSET', KEYS[1], f, ARGV[i + 5])
    else
      redis.call('HDEL', KEYS[1], f)
    end
  end
end
return conflicts
"""

# KEYS[1]; ARGV: px ('' = none), then three per field: field, value, increment ('' = none,
# else 'i' or 'f' and the amount) -> fields written. A field another replica restored first
# keeps its value plus this replica's outage increments (so counts add up across replicas).
RESTORE_HASH = """
local n = 0
for i = 2, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    n = n + 1
  elseif ARGV[i + 2] ~= '' then
    local kind, amount = string.sub(ARGV[i + 2], 1, 1), string.sub(ARGV[i + 2], 2)
    if kind == 'f' then
      redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], amount)
    else
      redis.call('HINCRBY', KEYS[1], ARGV[i], amount)
    end
    n = n + 1
  end
end
if n > 0 and ARGV[1] ~= '' and redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
"""

# KEYS[1]; ARGV: px ('' = none), value... -> 1 if the list was absent and is now written
RESTORE_LIST = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
if ARGV[1] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""

"""Hand-made mutants of the Redis Lua scripts (``backends/redis/*.py``).

At least one for every branch of a script that decides an ACK, a seq, a
conflict, a recovery entry or an authorisation. Snippets shared by many
scripts (``lua.py``: the prologue, retention, intervals; ``commits.py``:
``same_intent``) are mutated where they are written, so every script that
splices them in gets the mutant.
"""

# ruff: noqa: E501  (the texts are exact lines of the mutated sources)

from __future__ import annotations

from tests.mutation.hook import Edit, Mutant, Promise

LUA = "backends.redis.lua"
COMMITS = "backends.redis.commits"
MEMBERS = "backends.redis.members"
HISTORY = "backends.redis.history"
RECOVERY = "backends.redis.recovery"


def _lua(id: str, promise: Promise, what: str, module: str, old: str, new: str = "") -> Mutant:
    return Mutant(id, "lua", promise, what, (Edit(module, old, new),))


LUA_MUTANTS: tuple[Mutant, ...] = (
    # --- the prologue every script shares ------------------------------------------
    _lua(
        "lua-prologue-no-identity-guard", "seq",
        "every script runs on a shard that lost its deployment identity (wiped, replaced)",
        LUA, "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'wiped'} end\n",
    ),
    _lua(
        "lua-live-always", "ACK",
        "live() ignores expiry: committed records and pointers never expire logically",
        LUA, "return (not expiry) or tonumber(expiry) > now", "return true",
    ),
    _lua(
        "lua-live-at-expiry", "ACK",
        "live() off by one: a record is still live at its expiry instant",
        LUA, "tonumber(expiry) > now", "tonumber(expiry) >= now",
    ),
    # --- retention sweep ---------------------------------------------------------------
    _lua(
        "lua-sweep-no-pinned-clamp", "recovery",
        "retention cuts past the lowest pinned seq (an unfinished intent's record goes)",
        LUA, "  if low[2] then cut = math.min(cut, tonumber(low[2]) - 1) end\n",
    ),
    _lua(
        "lua-sweep-clamp-off-by-one", "recovery",
        "retention cuts the lowest pinned seq itself",
        LUA, "math.min(cut, tonumber(low[2]) - 1)", "math.min(cut, tonumber(low[2]))",
    ),
    # --- same_intent / has_record (put_record, publish, commit) --------------------------
    _lua(
        "lua-same-intent-expired-is-committed", "ACK",
        "an expired committed record still counts as this intent's commit",
        COMMITS, "    if not live(c.x) then return 'absent' end\n",
    ),
    _lua(
        "lua-same-intent-no-message-id-check", "ACK",
        "a committed record of another message id counts as this intent's",
        COMMITS, "    if c.m ~= mid then return 'mismatch' end\n",
    ),
    _lua(
        "lua-same-intent-no-record-check", "conflict",
        "an unfinished intent with the same seq but another record counts as the same",
        COMMITS, "if c.s ~= seq or c.r ~= rec then", "if c.s ~= seq then",
    ),
    _lua(
        "lua-has-record-always", "ACK",
        "has_record() says yes without looking at history",
        COMMITS, "  return bare_member(at[1]) == member", "  return true",
    ),
    # --- reserve -------------------------------------------------------------------------
    _lua(
        "lua-reserve-seq-before-exists", "seq",
        "reserve allocates a seq before it checks whether the key exists (replays burn seqs)",
        COMMITS,
        "--@intervals\nlocal fields = redis.call('HGETALL', KEYS[3])",
        "--@intervals\nredis.call('HINCRBY', KEYS[2], 's', 1)\n"
        "local fields = redis.call('HGETALL', KEYS[3])",
    ),
    _lua(
        "lua-reserve-no-exists-check", "seq",
        "reserve overwrites an existing key (a retry gets a new seq)",
        COMMITS,
        "if #fields > 0 and live(redis.call('HGET', KEYS[3], 'x')) then return {'exists', fields} end",
        "if false then return {'exists', fields} end",
    ),
    _lua(
        "lua-reserve-exists-ignores-expiry", "ACK",
        "reserve replays a committed key whose idempotency window has passed",
        COMMITS,
        "if #fields > 0 and live(redis.call('HGET', KEYS[3], 'x')) then return {'exists', fields} end",
        "if #fields > 0 then return {'exists', fields} end",
    ),
    _lua(
        "lua-reserve-no-pointer-check", "conflict",
        "reserve accepts a key that is live in another conversation",
        COMMITS,
        "  if ptr[1] and live(ptr[2]) and ptr[1] ~= ARGV[3] then return {'other'} end\n"
        "end\nif redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end",
        "end\nif redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end",
    ),
    _lua(
        "lua-reserve-no-conversation-check", "seq",
        "reserve allocates a seq in a conversation that does not exist",
        COMMITS,
        "if redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end\n"
        "local delivery = ARGV[8]",
        "local delivery = ARGV[8]",
    ),
    _lua(
        "lua-reserve-no-pin", "recovery",
        "reserve does not pin its seq against retention",
        COMMITS, "redis.call('ZADD', KEYS[4], seq, seq)\n",
    ),
    _lua(
        "lua-reserve-no-queue-entry", "recovery",
        "reserve does not put the intent in the recovery queue",
        COMMITS, "redis.call('ZADD', KEYS[5], now, ARGV[9])\n",
    ),
    _lua(
        "lua-reserve-no-created-entry", "recovery",
        "reserve does not index the intent's creation time (oldest-unfinished statistics)",
        COMMITS, "redis.call('ZADD', KEYS[6], now, ARGV[9])\n",
    ),
    _lua(
        "lua-reserve-keeps-old-attempts", "recovery",
        "a key reserved anew keeps the failed attempts of an earlier intent",
        COMMITS, "redis.call('HDEL', KEYS[7], ARGV[9])\nreturn {'reserved'",
        "return {'reserved'",
    ),
    _lua(
        "lua-reserve-state-recorded", "ACK",
        "reserve writes the intent as RECORDED before its record is in history",
        COMMITS, "redis.call('HSET', KEYS[3], 'st', '0', 'id', ARGV[4]",
        "redis.call('HSET', KEYS[3], 'st', '1', 'id', ARGV[4]",
    ),
    _lua(
        "lua-reserve-admits-a-non-member", "authorisation",
        "reserve with admission lets a sender who is not a member reserve (and commit)",
        COMMITS, "  if not iv_is_member(redis.call('HGET', KEYS[8], ARGV[10])) then",
        "  if false then",
    ),
    _lua(
        "lua-reserve-admission-unknown-conversation", "seq",
        "reserve with admission goes on in a conversation that does not exist",
        COMMITS, "if ARGV[10] ~= '' and not version then return {'noconv'} end\n",
    ),
    _lua(
        "lua-reserve-freezes-caller-delivery-away", "recovery",
        "reserve with admission replaces the caller's frozen delivery by today's version",
        COMMITS, "  if delivery == '' then delivery = ", "  if true then delivery = ",
    ),
    # --- outbox_append (a pipelined commit's outbox step) ----------------------------------
    _lua(
        "lua-append-no-state-check", "ACK",
        "the pipelined outbox append publishes an intent whose record was never written",
        COMMITS, "if c[1] ~= '1' then return {'conflict', 'state'} end\n",
    ),
    _lua(
        "lua-append-no-record-check", "ACK",
        "the pipelined outbox append publishes an intent whose record is not in history",
        COMMITS,
        "if bare_member(at[1]) ~= c[2] .. ':' .. c[4] then return {'conflict', 'record'} end\n",
    ),
    _lua(
        "lua-commit-po-no-state-check", "ACK",
        "the pipelined commit marks an intent COMMITTED whose outbox append did not run",
        COMMITS, "  if not c.op then return {'conflict', 'publication'} end\n",
    ),
    # --- put_record ----------------------------------------------------------------------
    _lua(
        "lua-put-record-accepts-mismatch", "conflict",
        "put_record writes the record of an intent that is not the stored one",
        COMMITS,
        "local verdict = same_intent(c, ARGV[3], ARGV[4], ARGV[5])\n"
        "if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end\n"
        "if c.st ~= '0' then return {'ok'} end",
        "local verdict = same_intent(c, ARGV[3], ARGV[4], ARGV[5])\n"
        "if verdict == 'absent' then return {'conflict', verdict} end\n"
        "if c.st ~= '0' then return {'ok'} end",
    ),
    _lua(
        "lua-put-record-regresses-state", "ACK",
        "put_record of an intent past RESERVED sets it back to RECORDED",
        COMMITS, "if c.st ~= '0' then return {'ok'} end\n", "if c.st == '3' then return {'ok'} end\n",
    ),
    # --- mark_outbox_published ----------------------------------------------------------
    _lua(
        "lua-publish-no-publication-compare", "ACK",
        "publish accepts a different publication once one is recorded",
        COMMITS,
        "  if c.ps == ARGV[6] and c.pp == ARGV[7] then return {'ok'} end\n"
        "  return {'conflict', 'publication'}",
        "  return {'ok'}",
    ),
    _lua(
        "lua-publish-no-state-check", "ACK",
        "publish marks an intent that is not RECORDED",
        COMMITS, "if c.st ~= '1' then return {'conflict', 'state'} end\nif not has_record",
        "if not has_record",
    ),
    _lua(
        "lua-publish-no-record-check", "ACK",
        "publish marks an intent whose record is not in history",
        COMMITS,
        "if not has_record(KEYS[4], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end\n"
        "sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])\n"
        "redis.call('HSET', KEYS[2], 'st', '2'",
        "sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])\nredis.call('HSET', KEYS[2], 'st', '2'",
    ),
    # --- commit (mark_published_and_committed / mark_committed) ---------------------------
    _lua(
        "lua-commit-replay-ignores-publication", "ACK",
        "a committed key replays its ACK for a different publication",
        COMMITS,
        "  if publish and (c.ps ~= ARGV[7] or c.pp ~= ARGV[8]) then return {'conflict', 'publication'} end\n",
    ),
    _lua(
        "lua-commit-outboxed-ignores-publication", "ACK",
        "an OUTBOXED intent commits with a different publication than the recorded one",
        COMMITS,
        "    if ps ~= ARGV[7] or pp ~= ARGV[8] then return {'conflict', 'publication'} end\n",
    ),
    _lua(
        "lua-commit-no-state-check", "ACK",
        "mark_published_and_committed commits an intent that is not RECORDED",
        COMMITS, "  elseif c.st ~= '1' then\n    return {'conflict', 'state'}\n",
    ),
    _lua(
        "lua-commit-without-publication", "ACK",
        "mark_committed commits without a recorded publication",
        COMMITS, "elseif not ps then\n  return {'conflict', 'publication'}\nend",
        "end",
    ),
    _lua(
        "lua-commit-no-record-check", "ACK",
        "commit gives an ACK although the record is not in history",
        COMMITS,
        "if not has_record(KEYS[4], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end\n"
        "local identity",
        "local identity",
    ),
    _lua(
        "lua-commit-stays-in-queue", "recovery",
        "commit leaves the key in the recovery queue",
        LUA, "  redis.call('ZREM', queue, member)\n",
    ),
    _lua(
        "lua-commit-stays-in-created", "recovery",
        "commit leaves the key in the creation-time index (oldest-unfinished age)",
        LUA, "  redis.call('ZREM', created, member)\n",
    ),
    _lua(
        "lua-commit-stays-quarantined", "recovery",
        "a quarantined intent that commits stays in the quarantine",
        LUA, "  redis.call('ZREM', quarantine, member)\n",
    ),
    _lua(
        "lua-commit-always-unpins", "ACK",
        "a commit after retention passed its seq unpins it: the ACK's record can be cut at once",
        COMMITS,
        "if tonumber(c.s) > tonumber(redis.call('HGET', KEYS[3], 'wc') or '0') then",
        "if true then",
    ),
    _lua(
        "lua-commit-pointer-never-expires", "conflict",
        "the key pointer of a committed key never expires logically",
        LUA, "redis.call('HSET', pointer, 'c', conversation, 'x', expires)",
        "redis.call('HSET', pointer, 'c', conversation)",
    ),
    # --- load ------------------------------------------------------------------------------
    _lua(
        "lua-load-ignores-expiry", "ACK",
        "load returns a committed record whose idempotency window has passed",
        COMMITS,
        "if #fields > 0 and live(redis.call('HGET', KEYS[2], 'x')) then return {'here', fields} end",
        "if #fields > 0 then return {'here', fields} end",
    ),
    _lua(
        "lua-load-no-pointer-check", "conflict",
        "load does not see that the key is live in another conversation",
        COMMITS,
        "  if ptr[1] and live(ptr[2]) and ptr[1] ~= ARGV[3] then return {'other', ptr[1]} end\n",
    ),
    # --- history ---------------------------------------------------------------------------
    _lua(
        "lua-history-no-member-check", "authorisation",
        "history pages are served to non-members",
        HISTORY,
        "if not reader or reader == '' then return {'forbidden'} end\n",
        "if not reader or reader == '' then reader = '1' end\n",
    ),
    _lua(
        "lua-history-no-conversation-check", "authorisation",
        "history of a conversation that does not exist reads as forbidden/empty, not not-found",
        HISTORY, "if redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end\n",
    ),
    # --- membership intervals ----------------------------------------------------------------
    _lua(
        "lua-iv-is-member-flipped", "authorisation",
        "iv_is_member flipped: removed users are members, members are not",
        LUA, "return #iv_values(text) % 2 == 1", "return #iv_values(text) % 2 == 0",
    ),
    _lua(
        "lua-iv-member-at-until-inclusive", "delivery",
        "iv_member_at off by one: a user removed at v is still a member at v",
        LUA, "version < v[i + 1]", "version <= v[i + 1]",
    ),
    _lua(
        "lua-iv-member-at-since-exclusive", "delivery",
        "iv_member_at off by one: a user added at v is not yet a member at v",
        LUA, "v[i] <= version", "v[i] < version",
    ),
    _lua(
        "lua-admission-everyone", "authorisation",
        "admission admits every user",
        MEMBERS, "iv_is_member(redis.call('HGET', KEYS[3], ARGV[3])) and 1 or 0", "1",
    ),
    _lua(
        "lua-change-ignores-current-state", "authorisation",
        "a change appends an interval whatever the user's state (re-add of a member closes it)",
        MEMBERS, "  if iv_is_member(text) ~= add then", "  if true then",
    ),
    _lua(
        "lua-create-overwrites", "seq",
        "creating an existing conversation resets it (members and seq counter)",
        MEMBERS, "if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end\n",
    ),
    _lua(
        "lua-members-at-current-not-version", "delivery",
        "members_at lists today's members instead of the frozen version's",
        MEMBERS, "    if iv_member_at(texts[i], version) then", "    if iv_is_member(texts[i]) then",
    ),
    # --- recovery queue ----------------------------------------------------------------------
    _lua(
        "lua-defer-committed-key", "recovery",
        "defer_recovery re-queues a key that committed meanwhile",
        RECOVERY, "if redis.call('EXISTS', KEYS[2]) == 0 or st == '3' then return {'gone'} end",
        "if redis.call('EXISTS', KEYS[2]) == 0 then return {'gone'} end",
    ),
    _lua(
        "lua-defer-never-quarantines", "recovery",
        "defer_recovery never quarantines",
        RECOVERY, "if ARGV[7] == '1' then", "if false then",
    ),
    _lua(
        "lua-quarantine-stays-queued", "recovery",
        "a quarantined intent stays in the due queue (retried forever)",
        RECOVERY, "  redis.call('ZREM', KEYS[3], ARGV[3])\n  redis.call('ZREM', KEYS[4], ARGV[3])\n",
        "  redis.call('ZREM', KEYS[4], ARGV[3])\n",
    ),
    _lua(
        "lua-defer-no-backoff", "recovery",
        "a failed attempt is due again at once (no backoff)",
        RECOVERY, "redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[3])",
        "redis.call('ZADD', KEYS[3], now, ARGV[3])",
    ),
    _lua(
        "lua-release-not-requeued", "recovery",
        "a released quarantined intent does not return to the due queue",
        RECOVERY, "redis.call('ZADD', KEYS[2], created, ARGV[3])\n",
    ),
)  # fmt: skip

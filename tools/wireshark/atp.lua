-- Wireshark / tshark dissector for ATP, NetApprox's approximate transport (docs/wire-format.md, version 2).
--
--   wireshark -X lua_script:tools/wireshark/atp.lua results/pcap/s1-s1-eth1.pcap
--   tshark -X lua_script:tools/wireshark/atp.lua -r capture.pcap -Y natp.flags.approx -V
--   or copy this file into Wireshark's personal Lua plugins folder (Help > About > Folders), e.g.
--   ~/.local/lib/wireshark/plugins/, to load it every time.
--
-- The protocol's filter name is "natp" (NetApprox ATP): Wireshark's "atp" is the AppleTalk Transaction Protocol.
--
-- Preferences (Edit > Preferences > Protocols > NATP, or tshark -o natp.port:7600 -o natp.report_port:7601):
--   natp.port         the ATP UDP port (DATA to it; ACK, GRANT, DONE, RETRY and NEW_TOKEN from it), 7600 by default
--   natp.report_port  the controller's report port (REPORT to it), 7601 by default; 0 turns it off
--   natp.floats       when a DATA payload is shown as a float32 range (bounded-loss vectors): auto (default),
--                     announced, never (FLOAT_MODES below)
--
-- Every header field is a filter field named as in hostlib/wire.py (natp.job_id, natp.tlr, ...); the TLR is
-- also shown as a fraction (natp.tlr_fraction = tlr / 32768). Payloads are decoded as far as the wire format
-- defines them: the job announce (its admission token and auth tag, then the manifest), FIN and the MSR change (reserved DATA
-- message ids), packed records (count >= 2: one subtree per message), trimmed DATA (natp.trimmed), float
-- ranges, ACK SACK blocks with the grant and token fields their flags announce, GRANT packets (the same
-- layout), the REPORT body (with its optional HMAC tag), DONE's lost message ids, RETRY's admission token and NEW_TOKEN's
-- address-validation token.
-- A packet hostlib would reject is marked malformed with the same reason tag (natp.error: bad_version (any
-- version but 2, version 1 included), bad_type, bad_tlr, bad_index, bad_count, truncated, bad_pack, bad_trim,
-- bad_ack, bad_grant, bad_report, bad_done, bad_floats, bad_announce, bad_retry, bad_new_token, bad_msr_change).
-- tests/tools/test_wireshark.py checks every field against hostlib.wire on a pcap written with the scapy layer
-- and hostlib.wire.

local atp = Proto("natp", "NetApprox ATP (approximate transport)")

local HEADER_LEN = 32
local VERSION = 2
local TLR_ONE = 0x8000 -- Q1.15: 0x8000 is 1.0
local APPROX, TRIM, GRANT, TOKEN = 0x01, 0x20, 0x40, 0x80 -- flag bits (every bit of the flags byte is defined)
local ANNOUNCE_MSG_ID = 0xFFFFFFFF
local FIN_MSG_ID = 0xFFFFFFFE
local MSR_MSG_ID = 0xFFFFFFFC -- a live MSR change: change:u32 | msr:u16 (Q1.15, below 1)
local NO_VECTOR = 0xFFFFFFFF
local MAX_SACK_BLOCKS = 16
local REPORT_BODY_LEN = 24
local REPORT_MAC_LEN = 16
local TOKEN_LEN = 16 -- admission token (RETRY and NEW_TOKEN payload, first field of every announce part)
local AUTH_LEN = 16 -- announce HMAC tag under the shared admission key (all zero without one)
local MANIFEST_HEAD_LEN = 18 -- "ATPJ" | total:u32 | vector_len:u32 | need_bytes:u32 | n_groups:u16
local RECORD_HEADER_LEN = 6 -- a packed record: msg_id:u32 | len:u16 | data
local GRANT_LEN = 4

local function q15(v) return v / TLR_ONE end

-- Preferences ------------------------------------------------------------------------------------------------

local FLOATS_AUTO, FLOATS_ANNOUNCED, FLOATS_NEVER = 1, 2, 3
local FLOAT_MODES = {
    { "auto", "Jobs announced as vectors, and one-packet messages whose length matches a range header",
        FLOATS_AUTO },
    { "announced", "Only jobs whose announce (vector_len set) is in the capture", FLOATS_ANNOUNCED },
    { "never", "Never", FLOATS_NEVER },
}
atp.prefs.port = Pref.uint("ATP UDP port", 7600,
    "UDP port of ATP DATA (destination), ACK, GRANT, DONE, RETRY and NEW_TOKEN (source)")
atp.prefs.report_port = Pref.uint("Report UDP port", 7601,
    "UDP port of the controller's report socket (REPORT packets go there); 0: do not register")
atp.prefs.floats = Pref.enum("Float ranges", FLOATS_AUTO,
    "When to show a DATA payload as a float32 range (first_index, count, values): jobs announced as vectors, "
    .. "and (default) any one-packet message whose length matches its range header", FLOAT_MODES, false)

-- Fields -----------------------------------------------------------------------------------------------------

local f = atp.fields

-- payloads (declared first: the per-type table below refers to the functions that use them)
f.error = ProtoField.string("natp.error", "Malformed", base.ASCII, "Why hostlib.wire would reject this packet")
f.payload = ProtoField.bytes("natp.payload", "Payload")
f.trailing = ProtoField.bytes("natp.trailing", "Bytes after length", base.NONE,
    "UDP payload beyond 32 + length (ignored by receivers)")
f.announce_token = ProtoField.bytes("natp.announce.token",
    "Token (a RETRY's, an ACK's echoed, or an address-validation token from a NEW_TOKEN)")
f.announce_auth = ProtoField.bytes("natp.announce.auth", "Admission HMAC tag")
f.announce_part = ProtoField.bytes("natp.announce.part", "Announce part (not reassembled)")
f.announce_magic = ProtoField.string("natp.announce.magic", "Magic")
f.announce_total = ProtoField.uint32("natp.announce.total", "Messages (N)")
f.announce_vector_len = ProtoField.uint32("natp.announce.vector_len", "Vector length")
f.announce_need_bytes = ProtoField.uint32("natp.announce.need_bytes", "Bytes needed to meet every MSR", base.DEC,
    nil, nil, "Payload the sender must deliver at least (a hint for a receiver that grants)")
f.announce_n_groups = ProtoField.uint16("natp.announce.n_groups", "Groups")
f.announce_group_id = ProtoField.uint16("natp.announce.group_id", "Group id")
f.announce_msr = ProtoField.uint16("natp.announce.msr", "MSR (Q1.15)", base.HEX)
f.announce_msr_fraction = ProtoField.double("natp.announce.msr_fraction", "MSR")
f.msr_change = ProtoField.uint32("natp.msr_change.change", "MSR change number")
f.msr_change_msr = ProtoField.uint16("natp.msr_change.msr", "New MSR (Q1.15)", base.HEX)
f.msr_change_fraction = ProtoField.double("natp.msr_change.msr_fraction", "New MSR")
f.announce_count = ProtoField.uint32("natp.announce.count", "Messages in group")
f.announce_n_ranges = ProtoField.uint32("natp.announce.n_ranges", "Id ranges")
f.announce_range_first = ProtoField.uint32("natp.announce.range_first", "First message id")
f.announce_range_last = ProtoField.uint32("natp.announce.range_last", "Last message id")
f.floats_first = ProtoField.uint32("natp.floats.first_index", "First index")
f.floats_count = ProtoField.uint32("natp.floats.count", "Count")
f.floats_value = ProtoField.float("natp.floats.value", "Value")
f.sack_count = ProtoField.uint16("natp.sack.count", "SACK blocks")
f.sack_first = ProtoField.uint32("natp.sack.first", "First seq")
f.sack_last = ProtoField.uint32("natp.sack.last", "Last seq")
f.ack_grant = ProtoField.uint32("natp.ack.grant", "Grant (send below this seq)")
f.ack_token = ProtoField.bytes("natp.ack.token", "Admission token (echo it once on announce part 0)")
f.record_msg_id = ProtoField.uint32("natp.record.msg_id", "Message id")
f.record_len = ProtoField.uint16("natp.record.len", "Length")
f.record_data = ProtoField.bytes("natp.record.data", "Data")
f.trimmed = ProtoField.bool("natp.trimmed", "Trimmed DATA (a switch cut the payload; the receiver ACKs it as lost)")
f.report_loss = ProtoField.uint16("natp.report.loss", "Loss (Q1.15)", base.HEX)
f.report_loss_fraction = ProtoField.double("natp.report.loss_fraction", "Loss")
f.report_msr = ProtoField.uint16("natp.report.msr", "MSR (Q1.15)", base.HEX)
f.report_msr_fraction = ProtoField.double("natp.report.msr_fraction", "MSR")
f.report_rate_kbps = ProtoField.uint32("natp.report.rate_kbps", "Rate (kbit/s)")
f.report_total = ProtoField.uint32("natp.report.total", "Messages (N)")
f.report_delivered = ProtoField.uint32("natp.report.delivered", "Delivered")
f.report_lost = ProtoField.uint32("natp.report.lost", "Lost")
f.report_epoch = ProtoField.uint32("natp.report.epoch", "Sender epoch")
f.report_mac = ProtoField.bytes("natp.report.mac", "HMAC-SHA256 tag (16 bytes)")
f.done_n_ranges = ProtoField.uint32("natp.done.n_ranges", "Lost-id ranges")
f.done_first = ProtoField.uint32("natp.done.first", "First lost id")
f.done_end = ProtoField.uint32("natp.done.end", "End (first id after the range)")
f.done_lost = ProtoField.uint32("natp.done.lost", "Lost messages in this part")
f.retry_token = ProtoField.bytes("natp.retry.token", "Admission token")
f.new_token = ProtoField.bytes("natp.new_token.token", "Address-validation token")

local malformed = ProtoExpert.new("natp.malformed", "Malformed ATP packet", expert.group.MALFORMED,
    expert.severity.ERROR)
atp.experts = { malformed }

-- Marks the packet malformed; the first reason wins (as hostlib.wire stops at the first error).
local function bad(ctx, tree, range, reason, detail)
    if ctx.error == nil then
        ctx.error = reason
        tree:add(f.error, range, reason):set_generated()
    end
    tree:add_proto_expert_info(malformed, reason .. ": " .. detail)
end

-- Payloads by type -------------------------------------------------------------------------------------------

local vector_jobs = {} -- job_id -> true when this capture's announce for the job says "vector"

function atp.init()
    vector_jobs = {}
end

local function dissect_announce(pl, tree, ctx)
    local t = tree:add(atp, pl, "Job announce")
    local n = pl:len()
    if n < MANIFEST_HEAD_LEN then return bad(ctx, t, pl, "bad_announce", n .. " bytes") end
    t:add(f.announce_magic, pl(0, 4))
    if pl(0, 4):string() ~= "ATPJ" then return bad(ctx, t, pl(0, 4), "bad_announce", "wrong magic") end
    t:add(f.announce_total, pl(4, 4))
    local vlen = pl(8, 4):uint()
    t:add(f.announce_vector_len, pl(8, 4)):append_text(vlen == NO_VECTOR and " (not a vector)" or " floats")
    if vlen ~= NO_VECTOR and not ctx.visited then vector_jobs[ctx.job_id] = true end
    t:add(f.announce_need_bytes, pl(12, 4))
    local n_groups = pl(16, 2):uint()
    t:add(f.announce_n_groups, pl(16, 2))
    local off = MANIFEST_HEAD_LEN
    for _ = 1, n_groups do
        if off + 12 > n then return bad(ctx, t, pl, "bad_announce", "truncated group list") end
        local gid, n_ranges = pl(off, 2):uint(), pl(off + 8, 4):uint()
        local g = t:add(atp, pl(off, 12 + 8 * math.min(n_ranges, math.floor((n - off - 12) / 8))), "Group " .. gid)
        g:add(f.announce_group_id, pl(off, 2))
        g:add(f.announce_msr, pl(off + 2, 2)):append_text(string.format(" (%g)", q15(pl(off + 2, 2):uint())))
        g:add(f.announce_msr_fraction, pl(off + 2, 2), q15(pl(off + 2, 2):uint())):set_generated()
        g:add(f.announce_count, pl(off + 4, 4))
        g:add(f.announce_n_ranges, pl(off + 8, 4))
        off = off + 12
        if off + 8 * n_ranges > n then return bad(ctx, g, pl, "bad_announce", "truncated id ranges") end
        for _ = 1, n_ranges do
            local r = g:add(atp, pl(off, 8), string.format("Ids %d-%d", pl(off, 4):uint(), pl(off + 4, 4):uint()))
            r:add(f.announce_range_first, pl(off, 4))
            r:add(f.announce_range_last, pl(off + 4, 4))
            off = off + 8
        end
    end
    if off ~= n then bad(ctx, t, pl, "bad_announce", "bytes after the group list") end
end

local function dissect_floats(pl, tree, ctx, guessed)
    local n = pl:len()
    local t = tree:add(atp, pl, "Float range" .. (guessed and " (by length: no announce of this job seen)" or ""))
    if n < 8 then return bad(ctx, t, pl, "bad_floats", n .. " bytes, range header needs 8") end
    local first, count = pl(0, 4):uint(), pl(4, 4):uint()
    t:append_text(string.format(": [%d, %d)", first, first + count))
    ctx.info = string.format("floats [%d, %d)", first, first + count)
    t:add(f.floats_first, pl(0, 4))
    t:add(f.floats_count, pl(4, 4))
    if n ~= 8 + 4 * count then
        return bad(ctx, t, pl, "bad_floats", string.format("range says %d floats in %d bytes", count, n - 8))
    end
    for i = 0, count - 1 do t:add(f.floats_value, pl(8 + 4 * i, 4)) end
end

local function all_zero(range)
    for i = 0, range:len() - 1 do
        if range(i, 1):uint() ~= 0 then return false end
    end
    return true
end

-- An announce part: token | auth | chunk of the manifest (the whole manifest when pkt_cnt is 1).
local function dissect_announce_part(pl, tree, ctx)
    local n = pl:len()
    if n < TOKEN_LEN + AUTH_LEN then
        local t = tree:add(atp, pl, "Job announce")
        return bad(ctx, t, pl, "bad_announce",
            string.format("announce part of %d bytes, the token and auth fields need %d", n, TOKEN_LEN + AUTH_LEN))
    end
    local token, auth = pl(0, TOKEN_LEN), pl(TOKEN_LEN, AUTH_LEN)
    tree:add(f.announce_token, token):append_text(all_zero(token) and " (none yet)" or "")
    tree:add(f.announce_auth, auth):append_text(all_zero(auth) and " (no admission key)" or "")
    ctx.info = all_zero(token) and "announce (asks for a token)" or "announce"
    if n == TOKEN_LEN + AUTH_LEN then
        if ctx.pkt_cnt == 1 then bad(ctx, tree, pl, "bad_announce", "0 bytes") end
        return
    end
    local chunk = pl(TOKEN_LEN + AUTH_LEN)
    if ctx.pkt_cnt == 1 then return dissect_announce(chunk, tree, ctx) end
    tree:add(f.announce_part, chunk):append_text(string.format(" (part %d of %d)", ctx.pkt_idx + 1, ctx.pkt_cnt))
end

-- Packed records (count >= 2): msg_id:u32 | len:u16 | data, back to back, exactly filling the payload; the first
-- is the header's message, no id twice (hostlib.wire.decode_records, bad_pack). At most one item per 6 bytes.
local function dissect_records(pl, tree, ctx)
    local n = pl:len()
    local t = tree:add(atp, pl, string.format("Packed records (%d messages)", ctx.count))
    local off, ids, seen, dup = 0, {}, {}, false
    while off < n do
        if off + RECORD_HEADER_LEN > n then
            return bad(ctx, t, pl(off), "bad_pack", string.format("record header cut at byte %d of %d", off, n))
        end
        local msg_id, size = pl(off, 4):uint(), pl(off + 4, 2):uint()
        local r = t:add(atp, pl(off, math.min(RECORD_HEADER_LEN + size, n - off)),
            string.format("Record %d: message %d, %d bytes", #ids, msg_id, size))
        r:add(f.record_msg_id, pl(off, 4))
        r:add(f.record_len, pl(off + 4, 2))
        off = off + RECORD_HEADER_LEN
        if off + size > n then
            return bad(ctx, r, pl(off - RECORD_HEADER_LEN),
                "bad_pack", string.format("record of message %d (%d bytes) past the payload", msg_id, size))
        end
        if size > 0 then r:add(f.record_data, pl(off, size)) end
        off = off + size
        ids[#ids + 1] = msg_id
        dup = dup or seen[msg_id] ~= nil
        seen[msg_id] = true
    end
    if #ids ~= ctx.count or ids[1] ~= ctx.msg_id then
        return bad(ctx, t, pl, "bad_pack", string.format("%d records, count says %d; first %s, header msg_id %d",
            #ids, ctx.count, tostring(ids[1]), ctx.msg_id))
    end
    if dup then return bad(ctx, t, pl, "bad_pack", "a message twice in one packet") end
    ctx.info = "packed msgs " .. table.concat(ids, ",")
end

-- Trimmed DATA: a switch whose queue was full forwarded the header alone, TRIM set, APPROX cleared, length 0,
-- never on a control message (hostlib's receivers count anything else as bad_trim).
local function dissect_trimmed(pl, tree, ctx)
    if bit.band(ctx.flags, APPROX) ~= 0 or ctx.length ~= 0 or ctx.msg_id >= MSR_MSG_ID then
        bad(ctx, tree, ctx.flags_range, "bad_trim",
            "TRIM with APPROX still set, with a payload or on a control message")
        if pl:len() > 0 then tree:add(f.payload, pl) end
        return
    end
    tree:add(f.trimmed, true):set_generated()
    ctx.info = "trimmed (header only)"
end

-- A live MSR change of the header's group: change:u32 | msr:u16 (Q1.15); change >= 1, msr < 1.
local function dissect_msr_change(pl, tree, ctx)
    if pl:len() ~= 6 then
        return bad(ctx, tree, pl, "bad_msr_change", string.format("%d bytes, an MSR change has 6", pl:len()))
    end
    local change, q = pl(0, 4):uint(), pl(4, 2):uint()
    tree:add(f.msr_change, pl(0, 4))
    tree:add(f.msr_change_msr, pl(4, 2))
    tree:add(f.msr_change_fraction, pl(4, 2), q / 32768):set_generated()
    if change == 0 or q >= 0x8000 then
        return bad(ctx, tree, pl, "bad_msr_change", "change >= 1 and msr < 1")
    end
    ctx.info = string.format("MSR change %d: group %d MSR %.4f", change, ctx.group_id, q / 32768)
end

local function dissect_data(pl, tree, ctx)
    if bit.band(ctx.flags, TRIM) ~= 0 then
        return dissect_trimmed(pl, tree, ctx)
    elseif ctx.msg_id == ANNOUNCE_MSG_ID then
        return dissect_announce_part(pl, tree, ctx)
    elseif ctx.msg_id == MSR_MSG_ID then
        return dissect_msr_change(pl, tree, ctx)
    elseif ctx.msg_id == FIN_MSG_ID then
        ctx.info = "FIN"
        if pl:len() > 0 then tree:add(f.payload, pl) end
        return
    end
    if ctx.count > 1 then return dissect_records(pl, tree, ctx) end
    if pl:len() == 0 then return end
    local mode = atp.prefs.floats
    if ctx.pkt_cnt == 1 and mode ~= FLOATS_NEVER then
        if vector_jobs[ctx.job_id] then return dissect_floats(pl, tree, ctx, false) end
        if mode == FLOATS_AUTO and pl:len() >= 8 and pl:len() == 8 + 4 * pl(4, 4):uint() then
            return dissect_floats(pl, tree, ctx, true)
        end
    end
    tree:add(f.payload, pl)
end

-- SACK blocks: n:u16 then n inclusive (first, last) pairs, newest first, at most 16 (may be empty: no blocks).
local function dissect_sack(pl, tree, ctx)
    local n = pl:len()
    if n == 0 then return nil end
    local t = tree:add(atp, pl, "Selective ack")
    if n < 2 then return bad(ctx, t, pl, "bad_ack", "ACK payload shorter than its block count") end
    local count = pl(0, 2):uint()
    t:add(f.sack_count, pl(0, 2))
    if count > MAX_SACK_BLOCKS or n ~= 2 + 8 * count then
        return bad(ctx, t, pl, "bad_ack", string.format("%d SACK blocks in %d payload bytes", count, n))
    end
    local blocks = {}
    for i = 0, count - 1 do
        local first, last = pl(2 + 8 * i, 4):uint(), pl(6 + 8 * i, 4):uint()
        local b = t:add(atp, pl(2 + 8 * i, 8), string.format("Block %d: seq %d-%d", i, first, last))
        b:add(f.sack_first, pl(2 + 8 * i, 4))
        b:add(f.sack_last, pl(6 + 8 * i, 4))
        blocks[#blocks + 1] = first .. "-" .. last
        if first > last then bad(ctx, b, pl(2 + 8 * i, 8), "bad_ack", "SACK block runs backwards") end
    end
    return count > 0 and "SACK " .. table.concat(blocks, ",") or nil
end

-- ACK (and GRANT) payload: the SACK blocks, then grant:u32 with the GRANT flag, then the 16-byte token with the
-- TOKEN flag (hostlib.wire.decode_ack). A TRIM ACK echoes a trimmed DATA packet: its sender counts it lost.
local function dissect_ack(pl, tree, ctx)
    local n = pl:len()
    local has_grant, has_token = bit.band(ctx.flags, GRANT) ~= 0, bit.band(ctx.flags, TOKEN) ~= 0
    local tail = (has_grant and GRANT_LEN or 0) + (has_token and TOKEN_LEN or 0)
    if n < tail then
        local t = tree:add(atp, pl, "ACK payload")
        return bad(ctx, t, pl, "bad_ack", string.format("ACK payload of %d bytes, its flags need %d", n, tail))
    end
    local info = {}
    if n > tail then info[#info + 1] = dissect_sack(pl(0, n - tail), tree, ctx) end -- pl(0, 0) is out of bounds
    local off = n - tail
    if has_grant then
        ctx.grant = pl(off, 4):uint()
        tree:add(f.ack_grant, pl(off, 4))
        info[#info + 1] = "grant " .. ctx.grant
        off = off + GRANT_LEN
    end
    if has_token then
        local token = pl(off, TOKEN_LEN)
        tree:add(f.ack_token, token)
        info[#info + 1] = "token"
        if all_zero(token) then bad(ctx, tree, token, "bad_ack", "an all-zero admission token") end
    end
    if bit.band(ctx.flags, TRIM) ~= 0 then info[#info + 1] = "(echoes a trimmed packet)" end
    ctx.info = #info > 0 and table.concat(info, " ") or "no SACK blocks"
end

-- GRANT: the ACK layout with n = 0 and the grant field; a sender ignores one without the GRANT flag (bad_grant).
local function dissect_grant(pl, tree, ctx)
    dissect_ack(pl, tree, ctx)
    if bit.band(ctx.flags, GRANT) == 0 then
        bad(ctx, tree, ctx.flags_range, "bad_grant", "a GRANT without the GRANT flag and field")
    end
end

local function dissect_report(pl, tree, ctx)
    local n = pl:len()
    local t = tree:add(atp, pl, "Report")
    if n ~= REPORT_BODY_LEN and n ~= REPORT_BODY_LEN + REPORT_MAC_LEN then
        return bad(ctx, t, pl, "bad_report", "report payload of " .. n .. " bytes")
    end
    local loss, msr = pl(0, 2):uint(), pl(2, 2):uint()
    t:add(f.report_loss, pl(0, 2)):append_text(string.format(" (%g)", q15(loss)))
    t:add(f.report_loss_fraction, pl(0, 2), q15(loss)):set_generated()
    t:add(f.report_msr, pl(2, 2)):append_text(string.format(" (%g)", q15(msr)))
    t:add(f.report_msr_fraction, pl(2, 2), q15(msr)):set_generated()
    t:add(f.report_rate_kbps, pl(4, 4))
    t:add(f.report_total, pl(8, 4))
    t:add(f.report_delivered, pl(12, 4))
    t:add(f.report_lost, pl(16, 4))
    t:add(f.report_epoch, pl(20, 4))
    if n > REPORT_BODY_LEN then t:add(f.report_mac, pl(REPORT_BODY_LEN, REPORT_MAC_LEN)) end
    if loss > TLR_ONE or msr > TLR_ONE then bad(ctx, t, pl(0, 4), "bad_report", "loss or MSR above 1.0") end
    ctx.info = string.format("loss %g msr %g rate %d kbit/s epoch %d%s", q15(loss), q15(msr), pl(4, 4):uint(),
        pl(20, 4):uint(), n > REPORT_BODY_LEN and " signed" or "")
end

local function dissect_done(pl, tree, ctx)
    local n = pl:len()
    local t = tree:add(atp, pl, "Done")
    if n < 4 then return bad(ctx, t, pl, "bad_done", "DONE payload of " .. n .. " bytes") end
    local count = pl(0, 4):uint()
    t:add(f.done_n_ranges, pl(0, 4))
    if n ~= 4 + 8 * count then
        return bad(ctx, t, pl, "bad_done", string.format("DONE says %d ranges in %d payload bytes", count, n))
    end
    local lost, prev_end = 0, 0
    for i = 0, count - 1 do
        local first, last = pl(4 + 8 * i, 4):uint(), pl(8 + 8 * i, 4):uint()
        local r = t:add(atp, pl(4 + 8 * i, 8), string.format("Lost ids %d..%d", first, last - 1))
        r:add(f.done_first, pl(4 + 8 * i, 4))
        r:add(f.done_end, pl(8 + 8 * i, 4))
        if not (prev_end <= first and first < last) then
            return bad(ctx, r, pl(4 + 8 * i, 8), "bad_done",
                string.format("DONE range [%d, %d) is empty or out of order", first, last))
        end
        lost, prev_end = lost + (last - first), last
    end
    t:add(f.done_lost, lost):set_generated()
    ctx.info = lost .. " lost in " .. count .. " range(s)"
end

local function dissect_retry(pl, tree, ctx)
    local n = pl:len()
    local t = tree:add(atp, pl, "Retry")
    if n ~= TOKEN_LEN or all_zero(pl) then
        return bad(ctx, t, pl, "bad_retry",
            string.format("RETRY payload of %d bytes, expected a %d-byte token", n, TOKEN_LEN))
    end
    t:add(f.retry_token, pl)
    ctx.info = "admission token"
end

-- NEW_TOKEN: an address-validation token for the sender's next jobs (the RETRY's layout).
local function dissect_new_token(pl, tree, ctx)
    local n = pl:len()
    local t = tree:add(atp, pl, "New token")
    if n ~= TOKEN_LEN or all_zero(pl) then
        return bad(ctx, t, pl, "bad_new_token",
            string.format("NEW_TOKEN payload of %d bytes, expected a %d-byte token", n, TOKEN_LEN))
    end
    t:add(f.new_token, pl)
    ctx.info = "address-validation token"
end

-- One entry per packet type (docs/wire-format.md "Payloads by type"): a new type is one line here (and, if it
-- has a payload, its function above). Types missing here are malformed (bad_type), as in hostlib.wire.
local TYPES = {
    [1] = { name = "DATA", payload = dissect_data },
    [2] = { name = "ACK", payload = dissect_ack },
    [3] = { name = "REPORT", payload = dissect_report },
    [4] = { name = "DONE", payload = dissect_done },
    [5] = { name = "RETRY", payload = dissect_retry },
    [6] = { name = "GRANT", payload = dissect_grant },
    [7] = { name = "NEW_TOKEN", payload = dissect_new_token },
}

-- Header -----------------------------------------------------------------------------------------------------

local SPECIAL_MSG_IDS = { [ANNOUNCE_MSG_ID] = " (job announce)", [FIN_MSG_ID] = " (FIN)",
                          [MSR_MSG_ID] = " (MSR change)" }
local type_names = {}
for code, t in pairs(TYPES) do type_names[code] = t.name end

-- flags: bit, filter name, label (docs/wire-format.md "Flags")
local FLAGS = {
    { 0x01, "approx", "APPROX" },
    { 0x02, "retx", "RETX" },
    { 0x04, "ece", "ECE" },
    { 0x08, "tagged", "TAGGED" },
    { 0x10, "ce", "CE" },
    { TRIM, "trim", "TRIM" },
    { GRANT, "grant", "GRANT" },
    { TOKEN, "token", "TOKEN" },
}

f.version = ProtoField.uint8("natp.version", "Version", base.DEC, nil, 0xF0)
f.type = ProtoField.uint8("natp.type", "Type", base.DEC, type_names, 0x0F)
f.flags = ProtoField.uint8("natp.flags", "Flags", base.HEX)
for _, fl in ipairs(FLAGS) do
    f["flags_" .. fl[2]] = ProtoField.bool("natp.flags." .. fl[2], fl[3], 8, nil, fl[1])
end
f.queue = ProtoField.uint8("natp.queue", "Queue")
f.priority = ProtoField.uint8("natp.priority", "Priority")
f.job_id = ProtoField.uint32("natp.job_id", "Job id")
f.msg_id = ProtoField.uint32("natp.msg_id", "Message id")
f.group_id = ProtoField.uint16("natp.group_id", "Group id")
f.tlr = ProtoField.uint16("natp.tlr", "TLR (Q1.15)", base.HEX)
f.tlr_fraction = ProtoField.double("natp.tlr_fraction", "TLR", "Target loss rate: tlr / 32768")
f.pkt_idx = ProtoField.uint16("natp.pkt_idx", "Packet index")
f.pkt_cnt = ProtoField.uint16("natp.pkt_cnt", "Packet count")
f.seq = ProtoField.uint32("natp.seq", "Sequence number")
f.deadline_us = ProtoField.uint32("natp.deadline_us", "Deadline (us)")
f.weight = ProtoField.uint8("natp.weight", "Weight")
f.count = ProtoField.uint8("natp.count", "Count (whole messages)", base.DEC, nil, nil,
    "DATA: messages the payload carries (>= 2: packed records); other types: zero, ignored")
f.length = ProtoField.uint16("natp.length", "Payload length")
f.surplus = ProtoField.bool("natp.surplus", "Surplus (approximate DATA with TLR 1.0: lowest queue, spare capacity only)")

local function flag_names(flags)
    local names = {}
    for _, fl in ipairs(FLAGS) do
        if bit.band(flags, fl[1]) ~= 0 then names[#names + 1] = fl[3] end
    end
    return table.concat(names, ",")
end

function atp.dissector(buf, pinfo, root)
    pinfo.cols.protocol = "ATP"
    local n = buf:len()
    local tree = root:add(atp, buf(0, math.min(n, HEADER_LEN)))
    local ctx = { visited = pinfo.visited }
    if n < HEADER_LEN then
        bad(ctx, tree, buf(), "truncated", string.format("%d bytes, header needs %d", n, HEADER_LEN))
        pinfo.cols.info = "ATP truncated"
        return n
    end
    local vt, flags, tlr = buf(0, 1):uint(), buf(1, 1):uint(), buf(14, 2):uint()
    local version, ptype = bit.rshift(vt, 4), bit.band(vt, 0x0F)
    ctx.job_id, ctx.msg_id, ctx.group_id = buf(4, 4):uint(), buf(8, 4):uint(), buf(12, 2):uint()
    ctx.pkt_idx, ctx.pkt_cnt = buf(16, 2):uint(), buf(18, 2):uint()
    ctx.flags, ctx.flags_range, ctx.count = flags, buf(1, 1), buf(29, 1):uint()
    local length = buf(30, 2):uint()
    ctx.length = length
    local spec = TYPES[ptype]
    local tname = spec and spec.name or ("type " .. ptype)

    tree:add(f.version, buf(0, 1))
    tree:add(f.type, buf(0, 1))
    local ft = tree:add(f.flags, buf(1, 1))
    ft:append_text(flags ~= 0 and (" (" .. flag_names(flags) .. ")") or "")
    for _, fl in ipairs(FLAGS) do ft:add(f["flags_" .. fl[2]], buf(1, 1)) end
    tree:add(f.queue, buf(2, 1)):append_text(buf(2, 1):uint() == 0xFF and " (not set)" or "")
    tree:add(f.priority, buf(3, 1))
    tree:add(f.job_id, buf(4, 4))
    tree:add(f.msg_id, buf(8, 4)):append_text(SPECIAL_MSG_IDS[ctx.msg_id] or "")
    tree:add(f.group_id, buf(12, 2))
    tree:add(f.tlr, buf(14, 2)):append_text(string.format(" (%g)", q15(tlr)))
    tree:add(f.tlr_fraction, buf(14, 2), q15(tlr)):set_generated()
    tree:add(f.pkt_idx, buf(16, 2))
    tree:add(f.pkt_cnt, buf(18, 2))
    tree:add(f.seq, buf(20, 4))
    tree:add(f.deadline_us, buf(24, 4)):append_text(buf(24, 4):uint() == 0xFFFFFFFF and " (no deadline)" or "")
    tree:add(f.weight, buf(28, 1))
    tree:add(f.count, buf(29, 1)):append_text(ptype == 1 and ctx.count > 1 and " (packed records)" or "")
    tree:add(f.length, buf(30, 2))
    tree:append_text(string.format(", %s, Job %d, Msg %d, Seq %d, TLR %g", tname, ctx.job_id, ctx.msg_id,
        buf(20, 4):uint(), q15(tlr)))

    -- the checks of hostlib.wire.decode, in its order
    if version ~= VERSION then
        bad(ctx, tree, buf(0, 1), "bad_version", string.format("version %d, expected %d", version, VERSION))
    elseif spec == nil then
        bad(ctx, tree, buf(0, 1), "bad_type", "packet type " .. ptype)
    elseif tlr > TLR_ONE then
        bad(ctx, tree, buf(14, 2), "bad_tlr", string.format("tlr 0x%04x above 1.0", tlr))
    elseif ctx.pkt_cnt == 0 or ctx.pkt_idx >= ctx.pkt_cnt then
        bad(ctx, tree, buf(16, 4), "bad_index", string.format("packet index %d of %d", ctx.pkt_idx, ctx.pkt_cnt))
    elseif ptype == 1 and (ctx.count == 0 or (ctx.count > 1 and (ctx.pkt_idx ~= 0 or ctx.pkt_cnt ~= 1))) then
        bad(ctx, tree, buf(29, 1), "bad_count", string.format("DATA packet of %d messages, packet %d of %d",
            ctx.count, ctx.pkt_idx, ctx.pkt_cnt))
    elseif n < HEADER_LEN + length then
        bad(ctx, tree, buf(30, 2), "truncated",
            string.format("payload %d bytes, header says %d", n - HEADER_LEN, length))
    end

    local surplus = ctx.error == nil and ptype == 1 and bit.band(flags, APPROX) ~= 0 and tlr == TLR_ONE
    if surplus then tree:add(f.surplus, buf(14, 2), true):set_generated() end

    local have = math.min(length, n - HEADER_LEN)
    if ctx.error == nil then
        spec.payload(buf(HEADER_LEN, have), tree, ctx) -- may be empty: an ACK without blocks is valid, a DONE not
    elseif have > 0 then
        tree:add(f.payload, buf(HEADER_LEN, have))
    end
    if n > HEADER_LEN + length then tree:add(f.trailing, buf(HEADER_LEN + length)) end

    local info = string.format("%s job %d msg %d seq %d TLR %g", tname, ctx.job_id, ctx.msg_id, buf(20, 4):uint(),
        q15(tlr))
    if flags ~= 0 then info = info .. " [" .. flag_names(flags) .. "]" end
    if surplus then info = info .. " surplus" end
    if ctx.info then info = info .. " " .. ctx.info end
    if ctx.error then info = info .. " (malformed: " .. ctx.error .. ")" end
    pinfo.cols.info = info
    return n
end

-- Registration on the configurable ports ---------------------------------------------------------------------

local udp_port = DissectorTable.get("udp.port")
local registered = {}

local function register_ports()
    for _, p in ipairs(registered) do udp_port:remove(p, atp) end
    registered = {}
    for _, p in ipairs({ atp.prefs.port, atp.prefs.report_port }) do
        if p ~= 0 then
            udp_port:add(p, atp)
            registered[#registered + 1] = p
        end
    end
end

function atp.prefs_changed()
    register_ports()
end

register_ports()

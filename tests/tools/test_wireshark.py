"""The Wireshark dissector (tools/wireshark/atp.lua) against hostlib.wire.

Packets of every type, valid and malformed, are built with the scapy layer (hostlib/scapy_atp.py) or encoded with
hostlib.wire (the version-2 packets: packed records, GRANT, grant and token fields, trimmed DATA) and written to
a pcap; tshark decodes it with the dissector, and every field it shows is compared with what hostlib.wire (and
hostlib.control for the job announce) decodes from the same bytes. Header fields are checked generically from
``wire.HEADER_FIELDS``, so a field added to the wire format must appear in the dissector too.
"""
from __future__ import annotations

import math
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

scapy_all = pytest.importorskip("scapy.all")
from scapy.all import IP, UDP, Ether, Raw, wrpcap  # noqa: E402

from netapprox.hostlib import control, wire  # noqa: E402
from netapprox.hostlib.scapy_atp import ATP  # noqa: E402

DISSECTOR = Path(__file__).resolve().parents[2] / "tools" / "wireshark" / "atp.lua"
TSHARK = shutil.which("tshark")
pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (Debian package 'tshark'; "
                                                       "`make setup` installs it)")

ATP_PORT, REPORT_PORT = wire.DEFAULT_ATP_PORT, wire.DEFAULT_REPORT_PORT
KEY = b"report-key"
VECTOR_JOB, GUESSED_JOB = 21, 22


def _to_sender(atp, payload=b"", **udp):
    """A packet from the receiver's ATP port (ACK, DONE)."""
    return UDP(sport=ATP_PORT, dport=40000, **udp) / atp / Raw(payload)


def _to_receiver(atp, payload=b"", dport=ATP_PORT):
    return UDP(sport=40000, dport=dport) / atp / Raw(payload)


def _wire_to_sender(data: bytes):
    """A datagram encoded by hostlib.wire, from the receiver's ATP port (ACK, GRANT)."""
    return UDP(sport=ATP_PORT, dport=40000) / Raw(data)


def _wire_to_receiver(data: bytes):
    """A datagram encoded by hostlib.wire, to the receiver's ATP port (DATA)."""
    return UDP(sport=40000, dport=ATP_PORT) / Raw(data)


def _data(payload: bytes = b"", **fields) -> bytes:
    """A DATA packet of job 5 as hostlib.wire encodes it."""
    return wire.encode(wire.Header(**{"job_id": 5, "msg_id": 3, "seq": 70, **fields}), payload)


def _ack(**fields) -> bytes:
    """An ACK (or with ptype GRANT, a GRANT) of job 5 as hostlib.wire encodes it."""
    return wire.encode_ack(**{"flags": 0, "queue": 2, "job_id": 5, "msg_id": 3, "group_id": 1, "pkt_idx": 0,
                              "pkt_cnt": 1, "seq": 70, "blocks": [], **fields})


def _cases() -> list[tuple[str, Any]]:
    """(name, UDP packet) for every type and payload of docs/wire-format.md, and malformed packets."""
    F = wire.Flags
    manifest = control.Manifest(total=10, vector_len=1000, need_bytes=123456, groups=(
        control.GroupShape.from_ids(0, 0.75, (0, 1, 2, 3, 4, 5, 7)), control.GroupShape.from_ids(3, 0.5, (6, 8, 9))))
    records = wire.encode_records([(3, b"first"), (8, b""), (2, bytes(range(40))), (11, b"\xff")])

    def announce_part(job_id, chunk, pkt_idx=0, pkt_cnt=1, token=b"admission token!", key=b"admission key"):
        return control.encode_announce_part(chunk, job_id=job_id, pkt_idx=pkt_idx, pkt_cnt=pkt_cnt, token=token,
                                            key=key)

    report = wire.Report(job_id=9, group_id=1, seq=77, tlr=0.3, loss=0.12, msr=0.9, rate_kbps=19500, total=2000,
                         delivered=1200, lost=31, epoch=88)
    return [
        ("data approximate tagged", _to_receiver(
            ATP(type=1, flags=F.APPROX | F.TAGGED, queue=3, priority=7, job_id=0xDEADBEEF, msg_id=41, group_id=2,
                tlr=0x1000, pkt_idx=1, pkt_cnt=3, seq=123456, deadline_us=5000, weight=200),
            wire.encode_float_range(0, [0.0]) + bytes(range(100)))),
        ("data retransmitted, TLR 1.0", _to_receiver(
            ATP(type=1, flags=F.RETX | F.APPROX, job_id=5, msg_id=0xFFFFFFF0 - 1, tlr=wire.TLR_ONE, seq=2**32 - 1),
            b"x" * 33)),
        ("job announce", _to_receiver(ATP(type=1, job_id=VECTOR_JOB, msg_id=control.ANNOUNCE_MSG_ID),
                                      announce_part(VECTOR_JOB, manifest.encode()))),
        ("job announce asking for a token", _to_receiver(ATP(type=1, job_id=25, msg_id=control.ANNOUNCE_MSG_ID),
                                                         announce_part(25, manifest.encode(), token=wire.NO_TOKEN,
                                                                       key=None))),
        ("float range of an announced vector", _to_receiver(
            ATP(type=1, flags=F.APPROX, job_id=VECTOR_JOB, msg_id=4, tlr=0x2000, seq=5),
            wire.encode_float_range(400, [1.5, -2.25, 3.0e-7, 1e30, 0.1]))),
        ("float range, announce not captured", _to_receiver(
            ATP(type=1, flags=F.APPROX, job_id=GUESSED_JOB, msg_id=1), wire.encode_float_range(7, [42.0, -1.0]))),
        ("announce part 2 of 2", _to_receiver(
            ATP(type=1, job_id=23, msg_id=control.ANNOUNCE_MSG_ID, pkt_idx=1, pkt_cnt=2),
            announce_part(23, b"\x00\x01" * 20, pkt_idx=1, pkt_cnt=2))),
        ("FIN", _to_receiver(ATP(type=1, job_id=VECTOR_JOB, msg_id=control.FIN_MSG_ID, seq=99))),
        ("MSR change", _wire_to_receiver(wire.encode(wire.Header(job_id=5, msg_id=control.MSR_MSG_ID, group_id=3,
                                                                 seq=77), control.encode_msr_change(2, 0.25)))),
        ("ACK with SACK blocks", _to_sender(
            ATP(type=2, flags=F.ECE, queue=2, job_id=5, msg_id=12, group_id=1, seq=1000),
            wire.encode_ack_payload([(990, 1000), (900, 980), (0, 0)]))),
        ("ACK without payload", _to_sender(ATP(type=2, job_id=5, msg_id=13, seq=1001))),
        ("ACK with zero blocks", _to_sender(ATP(type=2, job_id=5, msg_id=14, seq=1002),
                                            wire.encode_ack_payload([]))),
        ("REPORT", UDP(sport=41000, dport=REPORT_PORT) / ATP(report.encode())),
        ("REPORT with HMAC", UDP(sport=41000, dport=REPORT_PORT) / ATP(report.encode(KEY))),
        ("DONE", _to_sender(ATP(type=4, job_id=5, pkt_idx=0, pkt_cnt=2),
                            wire.encode_done_payloads([3, 17, 40, 41, 2**32 - 17, 2**32 - 2], 1368)[0])),
        ("DONE, nothing lost", _to_sender(ATP(type=4, job_id=6), wire.encode_done_payloads([], 1368)[0])),
        ("RETRY", _to_sender(ATP(type=5, job_id=7, msg_id=control.ANNOUNCE_MSG_ID, seq=5), b"\x01" * 4 + b"T" * 12)),
        ("NEW_TOKEN", _wire_to_sender(wire.encode_new_token(
            wire.Header(job_id=7, msg_id=control.ANNOUNCE_MSG_ID, seq=6), b"\x00\x01\x02\x03" + b"A" * 12))),
        ("bytes after length", _to_receiver(ATP(type=1, job_id=5, msg_id=1, length=4), b"abcdEXTRA")),
        # version 2: packing, grants, tokens, trimming (encoded by hostlib.wire)
        ("packed DATA, 4 records", _wire_to_receiver(_data(records, flags=F.APPROX | F.RETX, tlr=0x3000, count=4))),
        ("packed DATA, 2 empty records", _wire_to_receiver(_data(wire.encode_records([(3, b""), (4, b"")]),
                                                                 count=2))),
        ("GRANT", _wire_to_sender(_ack(ptype=wire.PacketType.GRANT, grant=2**32 - 1))),
        ("ACK with GRANT and TOKEN", _wire_to_sender(_ack(flags=F.ECE, blocks=[(60, 70), (50, 55)], grant=200,
                                                          token=b"\x01" * 4 + b"K" * 12))),
        ("ACK with TOKEN, no blocks", _wire_to_sender(_ack(token=b"token of 16 byte"))),
        ("ACK with GRANT, the block count left out", _wire_to_sender(
            wire.encode(wire.Header(type=wire.PacketType.ACK, flags=F.GRANT, job_id=5, seq=9), b"\x00\x00\x01\x00"))),
        ("ACK echoing a trimmed packet", _wire_to_sender(_ack(flags=F.TRIM, blocks=[(70, 70)]))),
        ("trimmed DATA", _wire_to_receiver(_data(flags=F.TRIM | F.TAGGED, tlr=0x2000, priority=3, weight=9,
                                                 deadline_us=400))),
        ("announce with need_bytes", _wire_to_receiver(_data(announce_part(26, manifest.encode()), job_id=26,
                                                             msg_id=control.ANNOUNCE_MSG_ID))),
        # malformed: hostlib rejects these, the dissector says why with the same reason
        ("version 1", _wire_to_receiver(wire.Header(version=1, job_id=5, msg_id=1, count=0).encode())),
        ("version 1 with payload", _wire_to_receiver(
            wire.encode(wire.Header(version=1, flags=F.APPROX, job_id=5, msg_id=1, count=0), b"old"))),
        ("type 0", _to_receiver(ATP(type=0, job_id=5))),
        ("type 9", _to_receiver(ATP(type=9, job_id=5))),
        ("NEW_TOKEN of 15 bytes", _to_sender(ATP(type=7, job_id=7, msg_id=control.ANNOUNCE_MSG_ID), b"T" * 15)),
        ("count 0", _wire_to_receiver(_data(b"abc", count=0))),
        ("packed DATA of a multi-packet message", _wire_to_receiver(_data(records, count=4, pkt_idx=0, pkt_cnt=2))),
        ("packed, count disagrees", _wire_to_receiver(_data(records, count=3))),
        ("packed, first record not the header's message", _wire_to_receiver(_data(records, msg_id=8, count=4))),
        ("packed, a message twice", _wire_to_receiver(_data(wire.encode_records([(3, b"a"), (3, b"b")]), count=2))),
        ("packed, record header cut", _wire_to_receiver(_data(wire.encode_records([(3, b"a")]) + b"\x00\x00\x00",
                                                              count=2))),
        ("packed, record past the payload", _wire_to_receiver(_data(wire.encode_records([(3, b"a")]) +
                                                                    struct.pack("!IH", 4, 9) + b"abc", count=2))),
        ("packed, empty payload", _wire_to_receiver(_data(b"", count=5))),
        ("trimmed, APPROX still set", _wire_to_receiver(_data(flags=F.TRIM | F.APPROX, tlr=0x1000))),
        ("trimmed, with a payload", _wire_to_receiver(_data(b"rest", flags=F.TRIM))),
        ("trimmed FIN", _wire_to_receiver(_data(flags=F.TRIM, msg_id=control.FIN_MSG_ID))),
        ("trimmed MSR change", _wire_to_receiver(_data(flags=F.TRIM, msg_id=control.MSR_MSG_ID))),
        ("MSR change of 5 bytes", _wire_to_receiver(wire.encode(wire.Header(job_id=5, msg_id=control.MSR_MSG_ID),
                                                                b"\x00\x00\x00\x01\x10"))),
        ("MSR change to 1", _wire_to_receiver(wire.encode(wire.Header(job_id=5, msg_id=control.MSR_MSG_ID),
                                                          struct.pack("!IH", 1, wire.TLR_ONE)))),
        ("ACK, flags promise a grant and a token", _wire_to_sender(
            wire.encode(wire.Header(type=wire.PacketType.ACK, flags=F.GRANT | F.TOKEN, job_id=5), b"\x00" * 12))),
        ("ACK, all-zero token", _wire_to_sender(_ack(blocks=[(1, 2)], token=wire.NO_TOKEN))),
        ("ACK, grant after a backwards block", _wire_to_sender(
            wire.encode(wire.Header(type=wire.PacketType.ACK, flags=F.GRANT, job_id=5),
                        struct.pack("!HIII", 1, 10, 9, 77)))),
        ("GRANT without the GRANT flag", _wire_to_sender(_ack(ptype=wire.PacketType.GRANT))),
        ("TLR above 1", _to_receiver(ATP(type=1, flags=1, job_id=5, tlr=wire.TLR_ONE + 1))),
        ("index past count", _to_receiver(ATP(type=1, job_id=5, pkt_idx=3, pkt_cnt=3))),
        ("zero packet count", _to_receiver(ATP(type=1, job_id=5, pkt_idx=0, pkt_cnt=0))),
        ("payload shorter than length", _to_receiver(ATP(type=1, job_id=5, length=100), b"0123456789")),
        ("datagram shorter than a header", UDP(sport=40000, dport=ATP_PORT) / Raw(bytes(ATP(type=1, job_id=5))[:20])),
        ("ACK, 17 blocks", _to_sender(ATP(type=2, job_id=5), struct.pack("!H", 17) + b"\x00" * 136)),
        ("ACK, block backwards", _to_sender(ATP(type=2, job_id=5), struct.pack("!HII", 1, 10, 9))),
        ("ACK, one byte", _to_sender(ATP(type=2, job_id=5), b"\x01")),
        ("REPORT, short body", UDP(sport=41000, dport=REPORT_PORT) / ATP(type=3, job_id=9) / Raw(b"\x00" * 20)),
        ("REPORT, loss above 1", UDP(sport=41000, dport=REPORT_PORT) / ATP(type=3, job_id=9) /
         Raw(struct.pack("!HHIIIII", 0x9000, 0x1000, 1, 2, 3, 4, 5))),
        ("DONE, count disagrees", _to_sender(ATP(type=4, job_id=5), struct.pack("!III", 3, 1, 2))),
        ("DONE, empty", _to_sender(ATP(type=4, job_id=5))),
        ("DONE, ranges out of order", _to_sender(ATP(type=4, job_id=5), struct.pack("!IIIII", 2, 10, 20, 5, 8))),
        ("float range, count disagrees", _to_receiver(ATP(type=1, job_id=VECTOR_JOB, msg_id=5),
                                                      struct.pack("!IIf", 0, 2, 1.0))),
        ("announce, wrong magic", _to_receiver(ATP(type=1, job_id=24, msg_id=control.ANNOUNCE_MSG_ID),
                                               announce_part(24, b"ATPX" + b"\x00" * 10))),
        ("announce, no room for the token", _to_receiver(ATP(type=1, job_id=24, msg_id=control.ANNOUNCE_MSG_ID),
                                                         b"\x00" * 20)),
        ("RETRY, short token", _to_sender(ATP(type=5, job_id=7, msg_id=control.ANNOUNCE_MSG_ID), b"T" * 15)),
        ("RETRY, zero token", _to_sender(ATP(type=5, job_id=7, msg_id=control.ANNOUNCE_MSG_ID), wire.NO_TOKEN)),
    ]


def _write_pcap(path: Path, packets) -> None:
    frames = [Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2") / p
              for p in packets]
    wrpcap(str(path), frames)


def _tshark(pcap: Path, fields: list[str], *prefs: str) -> list[dict[str, list[str]]]:
    cmd = [TSHARK, "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap), "-T", "fields",
           "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=|", "-E", "quote=n"]
    for pref in prefs:
        cmd += ["-o", pref]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Lua" not in out.stderr, out.stderr  # a script that fails to load leaves tshark running without it
    rows = []
    for line in out.stdout.splitlines():
        cols = line.split("\t")
        rows.append({f: ([] if c == "" else c.split("|")) for f, c in zip(fields, cols)})
    return rows


@pytest.fixture(scope="module")
def natp_fields() -> list[str]:
    out = subprocess.run([TSHARK, "-G", "fields", "-X", f"lua_script:{DISSECTOR}"], capture_output=True, text=True,
                         timeout=120)
    assert "Lua" not in out.stderr, out.stderr
    names = [line.split("\t")[2] for line in out.stdout.splitlines() if line.startswith("F\t")]
    return [n for n in names if n.startswith("natp.")]


# --- what hostlib decodes ---------------------------------------------------------------------------------


def _raw_header(data: bytes) -> dict[str, int]:
    """Every header field by its bit position in wire.HEADER_FIELDS (also for packets wire.decode rejects)."""
    value = int.from_bytes(data[:wire.HEADER_LEN], "big")
    out, shift = {}, wire.HEADER_LEN * 8
    for name, bits in wire.HEADER_FIELDS:
        shift -= bits
        out[name] = (value >> shift) & ((1 << bits) - 1)
    return out


def expected_fields(data: bytes, vector_jobs: set[int]) -> dict[str, list]:
    """The dissector's fields for one ATP datagram, computed with hostlib.wire / hostlib.control."""
    exp: dict[str, list] = {}
    if len(data) < wire.HEADER_LEN:
        return {"natp.error": ["truncated"]}
    raw = _raw_header(data)
    for name, _ in wire.HEADER_FIELDS:
        exp[f"natp.{name}"] = [raw[name]]
    exp["natp.tlr_fraction"] = [wire.q15_to_tlr(raw["tlr"])]
    for flag in wire.Flags:
        exp[f"natp.flags.{flag.name.lower()}"] = [int(bool(raw["flags"] & flag))]
    body = data[wire.HEADER_LEN:wire.HEADER_LEN + raw["length"]]
    if len(data) > wire.HEADER_LEN + raw["length"]:
        exp["natp.trailing"] = [data[wire.HEADER_LEN + raw["length"]:]]
    try:
        header, payload = wire.decode(data)
    except wire.MalformedPacket as e:
        exp["natp.error"] = [e.reason]
        if body:
            exp["natp.payload"] = [body]
        return exp
    if header.type == wire.PacketType.DATA and header.approx and header.tlr == wire.TLR_ONE:
        exp["natp.surplus"] = [1]  # docs/wire-format.md: surplus, queued below every job
    if _bad_trim(header):
        exp["natp.error"] = ["bad_trim"]
        if body:
            exp["natp.payload"] = [body]
        return exp
    assert {f"natp.{k}": [v] for k, v in _raw_header(header.encode()).items() if k != "length"} == \
        {k: v for k, v in exp.items() if k.startswith("natp.") and k[5:] in raw and k != "natp.length"}
    try:
        exp.update(_payload_fields(header, payload, data, vector_jobs))
    except wire.MalformedPacket as e:
        # hostlib rejects the payload as a whole; the dissector also shows the fields it could read before the
        # error, which have no counterpart to compare with (PAYLOAD_FIELDS are then not compared)
        exp["natp.error"] = [e.reason]
        exp[PARTIAL] = []
    return exp


def _bad_trim(header: wire.Header) -> bool:
    """docs/wire-format.md, "Trimmed DATA": a header no switch could have made (hostlib's receivers count it)."""
    return (header.type == wire.PacketType.DATA and bool(header.flags & wire.Flags.TRIM)
            and (header.approx or header.length > 0 or header.msg_id >= control.MSR_MSG_ID))


def _payload_fields(header: wire.Header, payload: bytes, data: bytes, vector_jobs: set[int]) -> dict[str, list]:
    T = wire.PacketType
    if header.type == T.DATA:
        if header.flags & wire.Flags.TRIM:
            return {"natp.trimmed": [1]}
        if header.msg_id == control.ANNOUNCE_MSG_ID:
            token, auth, chunk = control.decode_announce_part(payload)
            exp = {"natp.announce.token": [token], "natp.announce.auth": [auth]}
            if header.pkt_cnt > 1:
                return {**exp, "natp.announce.part": [chunk]}
            if chunk[:4] != b"ATPJ":
                raise wire.MalformedPacket("bad_announce", "wrong magic")
            m = control.Manifest.decode(chunk, max_messages=2**32)
            if m.vector_len is not None:
                vector_jobs.add(header.job_id)
            exp |= {"natp.announce.magic": ["ATPJ"], "natp.announce.total": [m.total],
                   "natp.announce.vector_len": [control.NO_VECTOR if m.vector_len is None else m.vector_len],
                   "natp.announce.need_bytes": [m.need_bytes],
                   "natp.announce.n_groups": [len(m.groups)]}
            for g in m.groups:
                ranges = control.ranges_of(g.msg_ids)
                for key, value in (("group_id", g.group_id), ("msr", wire.tlr_to_q15(g.msr)), ("msr_fraction", g.msr),
                                   ("count", g.count), ("n_ranges", len(ranges))):
                    exp.setdefault(f"natp.announce.{key}", []).append(value)
                for first, last in ranges:
                    exp.setdefault("natp.announce.range_first", []).append(first)
                    exp.setdefault("natp.announce.range_last", []).append(last)
            return exp
        if header.msg_id == control.FIN_MSG_ID:
            return {"natp.payload": [payload]} if payload else {}
        if header.msg_id == control.MSR_MSG_ID:
            change, msr = control.decode_msr_change(payload)
            return {"natp.msr_change.change": [change], "natp.msr_change.msr": [wire.tlr_to_q15(msr)],
                    "natp.msr_change.msr_fraction": [msr]}
        if header.count > 1:
            records = wire.decode_records(payload, header)
            return {"natp.record.msg_id": [m for m, _ in records], "natp.record.len": [len(d) for _, d in records],
                    "natp.record.data": [d for _, d in records if d]}
        if not payload:
            return {}
        looks_like_range = len(payload) >= 8 and len(payload) == 8 + 4 * struct.unpack_from("!I", payload, 4)[0]
        if header.pkt_cnt == 1 and (header.job_id in vector_jobs or looks_like_range):
            first, values = wire.decode_float_range(payload)
            return {"natp.floats.first_index": [first], "natp.floats.count": [len(values)],
                    "natp.floats.value": list(values)}
        return {"natp.payload": [payload]}
    if header.type in (T.ACK, T.GRANT):
        blocks, grant, token = wire.decode_ack(payload, header.flags)
        if header.type == T.GRANT and grant is None:
            raise wire.MalformedPacket("bad_grant", "a GRANT without its grant field: its sender ignores it")
        exp = {}
        if len(payload) > (4 if grant is not None else 0) + (wire.TOKEN_LEN if token is not None else 0):
            exp = {"natp.sack.count": [len(blocks)], "natp.sack.first": [a for a, _ in blocks],
                   "natp.sack.last": [b for _, b in blocks]}
        if grant is not None:
            exp["natp.ack.grant"] = [grant]
        if token is not None:
            exp["natp.ack.token"] = [token]
        return exp
    if header.type == T.REPORT:
        r = wire.Report.decode(data)
        exp = {"natp.report.loss": [wire.tlr_to_q15(r.loss)], "natp.report.loss_fraction": [r.loss],
               "natp.report.msr": [wire.tlr_to_q15(r.msr)], "natp.report.msr_fraction": [r.msr],
               "natp.report.rate_kbps": [r.rate_kbps], "natp.report.total": [r.total],
               "natp.report.delivered": [r.delivered], "natp.report.lost": [r.lost], "natp.report.epoch": [r.epoch]}
        if len(payload) > wire.REPORT_PAYLOAD_LEN:
            assert wire.Report.decode(data, key=KEY) == r  # the tag is the real HMAC
            exp["natp.report.mac"] = [payload[wire.REPORT_PAYLOAD_LEN:]]
        return exp
    if header.type == T.DONE:
        ranges = wire.decode_done_payload(payload)
        return {"natp.done.n_ranges": [len(ranges)], "natp.done.first": [a for a, _ in ranges],
                "natp.done.end": [b for _, b in ranges], "natp.done.lost": [sum(b - a for a, b in ranges)]}
    if header.type == T.RETRY:
        return {"natp.retry.token": [wire.decode_retry_payload(payload)]}
    if header.type == T.NEW_TOKEN:
        return {"natp.new_token.token": [wire.decode_new_token_payload(payload)]}
    raise AssertionError(f"no expectation for packet type {header.type!r}: describe its payload here")


def _same(shown: str, want) -> bool:
    if isinstance(want, bytes):
        return bytes.fromhex(shown.replace(":", "")) == want
    if isinstance(want, float):
        return math.isclose(float(shown), want, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(want, int):
        if shown in ("True", "False"):
            return int(shown == "True") == want
        return int(shown, 0) == want
    return shown == want


PARTIAL = "partial payload"
PAYLOAD_FIELDS = ("natp.announce.", "natp.floats.", "natp.sack.", "natp.report.", "natp.done.", "natp.retry.",
                  "natp.ack.", "natp.record.", "natp.trimmed", "natp.msr_change.")
EXPERT_FIELDS = ("natp.malformed",)  # expert items; natp.error carries the reason


def _compare(name: str, shown: dict[str, list[str]], want: dict[str, list]) -> list[str]:
    problems = []
    for field in sorted((set(shown) | set(want)) - {PARTIAL, *EXPERT_FIELDS}):
        if PARTIAL in want and field.startswith(PAYLOAD_FIELDS):
            continue
        s, w = shown.get(field, []), want.get(field, [])
        if len(s) != len(w) or not all(_same(a, b) for a, b in zip(s, w)):
            problems.append(f"{name}: {field}: tshark shows {s}, hostlib.wire decodes {w}")
    return problems


# --- tests ------------------------------------------------------------------------------------------------


def test_dissector_shows_every_wire_format_field(natp_fields):
    for name, _ in wire.HEADER_FIELDS:
        assert f"natp.{name}" in natp_fields
    assert "natp.tlr_fraction" in natp_fields
    for flag in wire.Flags:
        assert f"natp.flags.{flag.name.lower()}" in natp_fields


def test_every_field_matches_hostlib_wire(tmp_path, natp_fields):
    cases = _cases()
    pcap = tmp_path / "atp.pcap"
    _write_pcap(pcap, [p for _, p in cases])
    rows = _tshark(pcap, natp_fields)
    assert len(rows) == len(cases)
    vector_jobs: set[int] = set()
    problems = []
    for (name, pkt), shown in zip(cases, rows):
        data = bytes(pkt[UDP].payload)
        want = expected_fields(data, vector_jobs)
        problems += _compare(name, {k: v for k, v in shown.items() if v}, want)
    assert not problems, "\n".join(problems)
    reasons = {r["natp.error"][0] for r in rows if r["natp.error"]}
    assert reasons == {"truncated", "bad_version", "bad_type", "bad_tlr", "bad_index", "bad_count", "bad_pack",
                       "bad_trim", "bad_ack", "bad_grant", "bad_report", "bad_done", "bad_floats", "bad_announce",
                       "bad_retry", "bad_new_token", "bad_msr_change"}


def test_every_packet_type_is_named_in_the_info_column(tmp_path):
    types = list(wire.PacketType)
    pcap = tmp_path / "types.pcap"
    _write_pcap(pcap, [_to_receiver(ATP(type=int(t), job_id=3, msg_id=1, seq=8, tlr=0x4000)) for t in types])
    rows = _tshark(pcap, ["_ws.col.Protocol", "_ws.col.Info", "natp.type"])
    for t, row in zip(types, rows):
        assert row["_ws.col.Protocol"] == ["ATP"]
        info = row["_ws.col.Info"][0]
        assert info.startswith(f"{t.name} job 3 msg 1 seq 8 TLR 0.5"), (t, info)


def test_ports_are_preferences(tmp_path):
    data = UDP(sport=40000, dport=9000) / ATP(type=1, job_id=31, msg_id=2)
    report = UDP(sport=41000, dport=9001) / ATP(wire.Report(job_id=32, group_id=0, seq=1, tlr=0.5, loss=0.0, msr=0.5,
                                                            rate_kbps=1, total=1, delivered=0, lost=0, epoch=1).encode())
    default = _to_receiver(ATP(type=1, job_id=33, msg_id=2))
    pcap = tmp_path / "ports.pcap"
    _write_pcap(pcap, [data, report, default])
    shown = [r["natp.job_id"] for r in _tshark(pcap, ["natp.job_id"])]
    assert shown == [[], [], ["33"]]
    shown = [r["natp.job_id"] for r in _tshark(pcap, ["natp.job_id"], "natp.port:9000", "natp.report_port:9001")]
    assert shown == [["31"], ["32"], []]
    shown = [r["natp.job_id"] for r in _tshark(pcap, ["natp.job_id"], "natp.report_port:0")]
    assert shown == [[], [], ["33"]]


def test_float_range_preference(tmp_path):
    cases = dict(_cases())
    pcap = tmp_path / "floats.pcap"
    _write_pcap(pcap, [cases["job announce"], cases["float range of an announced vector"],
                       cases["float range, announce not captured"]])
    counts = {mode: [r["natp.floats.count"] for r in _tshark(pcap, ["natp.floats.count"], f"natp.floats:{mode}")]
              for mode in ("auto", "announced", "never")}
    assert counts == {"auto": [[], ["5"], ["2"]], "announced": [[], ["5"], []], "never": [[], [], []]}


def test_dissection_raises_no_lua_error(tmp_path):
    pcap = tmp_path / "all.pcap"
    _write_pcap(pcap, [p for _, p in _cases()])
    out = subprocess.run([TSHARK, "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap), "-V"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "Lua Error" not in out.stdout, out.stdout[-2000:]
    assert out.stdout.count("NetApprox ATP") == len(_cases())

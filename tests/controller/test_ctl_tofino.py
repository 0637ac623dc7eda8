"""Tofino deployments without a Tofino: the BfRt client's message schema against the SDE's bfruntime.proto (when one
is at hand) and against the fake BfRt server's own transcription of it (always); the fake refusing what the proto
does not declare, so a client encoding mistake fails; the Stratum chassis-config queue section parsed as
Stratum's ChassisConfig text, and its CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from netapprox.controller.p4runtime import bfrt
from netapprox.controller.p4runtime.bfrt import SCHEMA
from netapprox.controller.p4runtime.tofino_tm import PortQueues, stratum_queue_config, tm_plan
from support import bfrt_wire
from support.proto_text import proto_messages

REPO = Path(__file__).resolve().parents[2]


def _bfruntime_proto() -> Path | None:
    for candidate in (os.environ.get("NETAPPROX_BFRUNTIME_PROTO"),
                      os.environ.get("SDE") and
                      Path(os.environ["SDE"]) / "pkgsrc/bf-drivers/src/bf_rt/proto/bfruntime.proto"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


BFRUNTIME_PROTO = _bfruntime_proto()
SCALARS = {"uint32", "int32", "uint64", "bool", "string", "bytes", "float"}


@pytest.mark.skipif(BFRUNTIME_PROTO is None, reason="needs the SDE's bfruntime.proto: set NETAPPROX_BFRUNTIME_PROTO "
                                                    "(open-p4studio: pkgsrc/bf-drivers/src/bf_rt/proto/bfruntime.proto)"
                                                    " or SDE (the SDE's source tree)")
def test_the_bfrt_schema_matches_the_sdes_bfruntime_proto():
    real, enums = proto_messages(BFRUNTIME_PROTO.read_text())
    for message, fields in SCHEMA.items():
        assert message in real, f"no message {message} in {BFRUNTIME_PROTO}"
        for name, number, ftype, *_ in fields:
            assert name in real[message], f"{message}.{name} not in {BFRUNTIME_PROTO}"
            real_number, real_type, real_repeated = real[message][name]
            assert (number, ftype.endswith("*")) == (real_number, real_repeated), f"{message}.{name}"
            mine = ftype.rstrip("*")
            if real_type in SCALARS:
                assert mine == real_type, f"{message}.{name}: {mine} vs {real_type}"
            elif mine == "int32":  # an enum of the real file, carried as its varint
                assert any(e.endswith(real_type) for e in enums), f"{message}.{name}: {real_type} is no enum"


@pytest.mark.skipif(BFRUNTIME_PROTO is None, reason="needs the SDE's bfruntime.proto: set NETAPPROX_BFRUNTIME_PROTO "
                                                    "(open-p4studio: pkgsrc/bf-drivers/src/bf_rt/proto/bfruntime.proto)"
                                                    " or SDE (the SDE's source tree)")
def test_the_fake_bfrt_servers_schema_matches_the_sdes_bfruntime_proto():
    real, enums = proto_messages(BFRUNTIME_PROTO.read_text())
    for message, fields in bfrt_wire.SCHEMA.items():
        if message.startswith("google."):
            continue
        assert set(real[message]) == {f[0] for f in fields.values()}, message  # every field, not a subset
        for number, (name, ftype, repeated, _) in fields.items():
            real_number, real_type, real_repeated = real[message][name]
            assert (number, repeated) == (real_number, real_repeated), f"{message}.{name}"
            if ftype == "enum":
                assert any(e.endswith(real_type) for e in enums), f"{message}.{name}: {real_type} is no enum"
            elif ftype == "bytes" and real_type not in SCALARS:  # a message the fake keeps opaque
                assert real_type not in enums, f"{message}.{name}"
            else:  # nested types are named from inside their parent in the .proto
                real_name = real_type.lstrip(".").replace("bfrt_proto.", "")
                assert ftype == real_name or ftype.endswith("." + real_name), f"{message}.{name}: {ftype}"


def _client_fields() -> dict[str, dict[str, tuple[int, str, bool, str | None]]]:
    out = {}
    for message, fields in SCHEMA.items():
        out[message] = {}
        for spec in fields:
            name, number, ftype = spec[:3]
            out[message][name] = (number, ftype.rstrip("*"), ftype.endswith("*"), spec[3] if len(spec) > 3 else None)
    return out


def test_the_client_schema_agrees_with_the_fake_servers_transcription_of_bfruntime_proto():
    """Two transcriptions of bfruntime.proto made apart (the client's, the fake server's): every field the client
    sends or reads has the same number, kind, repetition and oneof in the fake's, so a slip in either shows up
    in every run, not only where an SDE is installed."""
    fake = {m: {f[0]: (n, f[1], f[2], f[3]) for n, f in fields.items()} for m, fields in bfrt_wire.SCHEMA.items()}
    for message, fields in _client_fields().items():
        assert message in fake, message
        for name, (number, ftype, repeated, oneof) in fields.items():
            f_number, f_type, f_repeated, f_oneof = fake[message][name]
            assert (number, repeated, oneof) == (f_number, f_repeated, f_oneof), f"{message}.{name}"
            kind = {"int32": ("enum", "int32")}.get(ftype, (ftype.lstrip(".").replace("bfrt_proto.", ""),))
            assert f_type in kind, f"{message}.{name}: client {ftype}, fake {f_type}"


# --- the fake BfRt server decodes on its own: a client encoding mistake fails ----------------------------------

def _mutant_pb(monkeypatch, message: str, field: str, number: int):
    """The client's message classes built from its SCHEMA with one field number changed (swapped with the field
    that had it, if any), in a pool of their own."""
    from google.protobuf import any_pb2
    from google.rpc import status_pb2

    old = next(f[1] for f in SCHEMA[message] if f[0] == field)
    renumber = {field: number} | {f[0]: old for f in SCHEMA[message] if f[1] == number}
    schema = {m: [tuple([f[0], renumber[f[0]], *f[2:]]) if m == message and f[0] in renumber else f for f in fields]
              for m, fields in SCHEMA.items()}
    monkeypatch.setattr(bfrt, "SCHEMA", schema)
    fdp = bfrt._file_descriptor()
    fdp.name = "netapprox_test/bfrt_mutant.proto"
    pool = descriptor_pool.DescriptorPool()
    for dep in (any_pb2.DESCRIPTOR, status_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        dep.CopyToProto(proto)
        pool.Add(proto)
    pool.Add(fdp)
    classes = {name.replace(".", "_"): message_factory.GetMessageClass(pool.FindMessageTypeByName(f"bfrt_proto.{name}"))
               for name in schema}
    monkeypatch.setattr(bfrt, "pb", type(bfrt.pb)(**classes))


@pytest.fixture
def bfrt_server():
    from support.fake_bfrt import FakeBfrtServer

    server = FakeBfrtServer(p4_name="netapprox").start()
    server.ports[136] = (1, list(range(8, 16)))
    yield server
    server.stop()


def _configure(server) -> None:
    from netapprox.controller.p4runtime.tofino_tm import BfrtTmClient, configure_queues

    client = BfrtTmClient(server.address, "netapprox", timeout_s=5)
    try:
        configure_queues(client, (136,), 64)
    finally:
        client.close()


def test_the_fake_bfrt_server_takes_the_clients_messages(bfrt_server):
    _configure(bfrt_server)
    assert bfrt_server.wire_errors == []
    assert bfrt_server.field_value("tf1.tm.queue.sched_cfg", 1, (1, 8), "max_priority") == "7"


@pytest.mark.parametrize("message,field,number,says", [
    ("TargetDevice", "pipe_id", 6, "TargetDevice: no field number 6"),  # a number the proto does not have
    ("WriteRequest", "updates", 4, "WriteRequest.atomicity (enum) sent length-delimited"),  # two swapped
    ("Subscribe", "device_id", 3, "Subscribe.device_id (uint32) sent length-delimited"),
    ("KeyField", "exact", 3, "TM keys are exact"),  # decodes, as a ternary match: the server's checks catch it
    ("DataField", "str_val", 3, "DataField.float_val (float) sent length-delimited"),
    ("TableEntry", "data", 4, "'pg_id'"),  # the client cannot read the fake's answers: it fails reading them
])
def test_a_client_encoding_mistake_fails_against_the_fake_server(monkeypatch, bfrt_server, message, field, number,
                                                                 says):
    """The client with one field number wrong (its messages rebuilt from a mutated SCHEMA) is refused by the fake
    server, which decodes with its own transcription of bfruntime.proto: client and fake do not agree by
    construction."""
    _mutant_pb(monkeypatch, message, field, number)
    with pytest.raises(Exception) as err:
        _configure(bfrt_server)
    assert says in str(err.value) or any(says in e for e in bfrt_server.wire_errors), \
        (str(err.value), bfrt_server.wire_errors)


# --- Stratum: the chassis-config queue section ---------------------------------------------------------------

# The part of Stratum's stratum/hal/lib/common/common.proto (package stratum.hal) the section uses: message,
# field and enum names and numbers as Stratum declares them (checked against the real file below when given).
STRATUM_SUBSET = {
    "ChassisConfig": [("vendor_config", 7, "VendorConfig")],
    "VendorConfig": [("tofino_config", 2, "TofinoConfig")],
    "TofinoConfig": [("node_id_to_qos_config", 3, "map<uint64, TofinoConfig.TofinoQosConfig>")],
    "TofinoConfig.TofinoQosConfig": [("queue_configs", 6, "TofinoConfig.TofinoQosConfig.QueueConfig*")],
    "TofinoConfig.TofinoQosConfig.QueueConfig": [("port", 1, "uint32"), ("sdk_port", 2, "uint32"),
                                                 ("queue_mapping", 3, "TofinoConfig.TofinoQosConfig.QueueConfig"
                                                                      ".QueueMapping*")],
    "TofinoConfig.TofinoQosConfig.QueueConfig.QueueMapping": [
        ("queue_id", 1, "int32"), ("priority", 2, "enum:SchedulingPriority"), ("weight", 3, "uint32"),
        ("minimum_guaranteed_cells", 4, "uint32"), ("pool", 5, "enum:ApplicationPool"),
        ("base_use_limit", 6, "uint32"), ("baf", 7, "enum:Baf"), ("hysteresis", 8, "uint32")],
}
STRATUM_ENUMS = {
    "SchedulingPriority": ["UNKNOWN_PRIO"] + [f"PRIO_{i}" for i in range(8)],
    "ApplicationPool": ["UNKNOWN_APP_POOL"] + [f"INGRESS_APP_POOL_{i}" for i in range(4)]
                       + [f"EGRESS_APP_POOL_{i}" for i in range(4)],
    "Baf": ["UNKNOWN_BAF", "BAF_1_POINT_5_PERCENT", "BAF_3_PERCENT", "BAF_6_PERCENT", "BAF_11_PERCENT",
            "BAF_20_PERCENT", "BAF_33_PERCENT", "BAF_50_PERCENT", "BAF_66_PERCENT", "BAF_80_PERCENT", "DISABLE_BAF"],
}


def _stratum_chassis_config_class():
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="netapprox_test/stratum_subset.proto", package="stratum_subset",
                                             syntax="proto3")
    msgs: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full in STRATUM_SUBSET:
        parent, _, short = full.rpartition(".")
        msgs[full] = (msgs[parent].nested_type.add() if parent else fdp.message_type.add())
        msgs[full].name = short
    qos = msgs["TofinoConfig.TofinoQosConfig"]
    for enum, values in STRATUM_ENUMS.items():
        e = qos.enum_type.add(name=enum)
        for number, value in enumerate(values):
            e.value.add(name=value, number=number)
    for full, fields in STRATUM_SUBSET.items():
        for name, number, ftype in fields:
            f = msgs[full].field.add(name=name, number=number, label=F.LABEL_OPTIONAL)
            if ftype.startswith("map<"):
                entry = msgs[full].nested_type.add(name="NodeIdToQosConfigEntry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                                type_name=".stratum_subset.TofinoConfig.TofinoQosConfig")
                f.label, f.type = F.LABEL_REPEATED, F.TYPE_MESSAGE
                f.type_name = ".stratum_subset.TofinoConfig.NodeIdToQosConfigEntry"
            elif ftype.startswith("enum:"):
                f.type, f.type_name = F.TYPE_ENUM, ".stratum_subset.TofinoConfig.TofinoQosConfig." + ftype[5:]
            elif ftype.rstrip("*") in ("uint32", "int32", "uint64"):
                f.type = getattr(F, "TYPE_" + ftype.upper())
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, ".stratum_subset." + ftype.rstrip("*")
                if ftype.endswith("*"):
                    f.label = F.LABEL_REPEATED
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("stratum_subset.ChassisConfig"))


def test_the_stratum_queue_section_is_a_valid_chassis_config_vendor_config():
    text = stratum_queue_config([136, 144], 400, node_id=1)
    config = text_format.Parse(text, _stratum_chassis_config_class()()).vendor_config
    (entry,) = config.tofino_config.node_id_to_qos_config.items()
    node, qos = entry
    assert node == 1
    assert [q.sdk_port for q in qos.queue_configs] == [136, 144]
    mappings = qos.queue_configs[0].queue_mapping
    enum = type(qos).DESCRIPTOR.enum_types_by_name
    assert [m.queue_id for m in mappings] == list(range(8))
    assert [enum["SchedulingPriority"].values_by_number[m.priority].name for m in mappings] == \
        [f"PRIO_{7 - q}" for q in range(8)]
    assert [m.base_use_limit for m in mappings] == [(400 - 28) * 19] + [(8 - q) * 19 for q in range(1, 8)]
    assert {enum["Baf"].values_by_number[m.baf].name for m in mappings} == {"DISABLE_BAF"}
    assert {enum["ApplicationPool"].values_by_number[m.pool].name for m in mappings} == {"EGRESS_APP_POOL_0"}
    assert {m.minimum_guaranteed_cells for m in mappings} == {0}


def test_the_tm_plan_and_the_stratum_section_scale_with_approx_buffer_unit():
    """``unit`` u: queue k >= 1 gets u x (8 - k) packets' cells, queue 0 the rest, in the BfRt plan and in the
    Stratum section alike; unit 1 (the default) is the paper's k-MTU queues."""
    port = PortQueues(dev_port=136, pipe=1, pg_id=1, pg_queues=tuple(range(8, 16)))
    want = [(400 - 4 * 28) * 19] + [4 * (8 - k) * 19 for k in range(1, 8)]

    def cells(ops):
        return [dict(op.data)["pool_max_cells"] for op in ops if op.table == "tf1.tm.queue.buffer"]
    assert cells(tm_plan([port], 400, unit=4)) == want
    assert cells(tm_plan([port], 400)) == [(400 - 28) * 19] + [(8 - k) * 19 for k in range(1, 8)]
    assert cells(tm_plan([port], 400, unit=2, cells_per_packet=10)) == [(400 - 56) * 10] + [2 * (8 - k) * 10
                                                                                            for k in range(1, 8)]
    text = stratum_queue_config([136, 144], 400, node_id=1, unit=4)
    qos = text_format.Parse(text, _stratum_chassis_config_class()()).vendor_config.tofino_config.node_id_to_qos_config
    assert list(qos) == [1]
    assert [[m.base_use_limit for m in qc.queue_mapping] for qc in qos[1].queue_configs] == [want, want]
    with pytest.raises(ValueError, match="leaves nothing for queue 0"):
        stratum_queue_config([136], 400, unit=15)  # 15 x 28 = 420 > 400


def test_the_stratum_cli_takes_approx_buffer_unit_from_the_config(tmp_path):
    config = tmp_path / "tofino.toml"
    example = (REPO / "controller/examples/tofino.toml").read_text()
    config.write_text(example.replace("buffer_packets = 400", "buffer_packets = 400\napprox_buffer_unit = 4", 1))
    res = subprocess.run([sys.executable, "-m", "netapprox.controller.p4runtime.tofino_tm", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         cwd=REPO)
    assert res.returncode == 0, res.stderr
    head, body = res.stdout.split("\n", 1)
    assert head == "# switch tor1: 2 ports, 400 packets per port, approx_buffer_unit 4"
    assert body == stratum_queue_config([136, 144], 400, node_id=1, unit=4)
    config.write_text(example.replace("buffer_packets = 400", "buffer_packets = 400\napprox_buffer_unit = 15", 1))
    bad = subprocess.run([sys.executable, "-m", "netapprox.controller.p4runtime.tofino_tm", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         cwd=REPO)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == (f"tofino_tm: {config}: [[switch]] 'tor1' options.approx_buffer_unit: a total "
                                  "buffer of 400 packets leaves nothing for queue 0 (approximate queues of 15 x 28 "
                                  "packets); at most 14 with buffer_packets 400")


def _stratum_common_proto() -> Path | None:
    path = os.environ.get("NETAPPROX_STRATUM_COMMON_PROTO")
    return Path(path) if path and Path(path).is_file() else None


@pytest.mark.skipif(_stratum_common_proto() is None, reason="needs Stratum's common.proto: set "
                                                          "NETAPPROX_STRATUM_COMMON_PROTO (stratum/hal/lib/common/)")
def test_the_stratum_subset_matches_stratums_common_proto():
    real, enums = proto_messages(_stratum_common_proto().read_text())
    for message, fields in STRATUM_SUBSET.items():
        for name, number, _ in fields:
            assert real[message][name][0] == number, f"{message}.{name}"
    for enum, values in STRATUM_ENUMS.items():
        assert enums[f"TofinoConfig.TofinoQosConfig.{enum}"] == {v: i for i, v in enumerate(values)}, enum


def test_the_stratum_cli_prints_the_section_for_the_example_config():
    res = subprocess.run([sys.executable, "-m", "netapprox.controller.p4runtime.tofino_tm", "--config",
                          str(REPO / "controller/examples/tofino.toml")], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert res.returncode == 0, res.stderr
    body = res.stdout.split("\n", 1)[1]
    assert body == stratum_queue_config([136, 144], 400, node_id=1, unit=7)  # the default: half_buffer_unit(400)
    assert res.stdout.startswith("# switch tor1: 2 ports, 400 packets per port")
    bad = subprocess.run([sys.executable, "-m", "netapprox.controller.p4runtime.tofino_tm", "--config",
                          str(REPO / "controller/examples/bmv2.toml")], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert bad.returncode == 2 and "no p4runtime switch with target = \"tofino\"" in bad.stderr
    assert "Traceback" not in bad.stderr

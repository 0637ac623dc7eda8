"""The P4 program (p4src/) on BMv2 and Tofino as a NetApprox data plane (``kind = "p4runtime"``).

One module per P4 control, named like it, owning its tables and a copy of what it installed:

| module              | P4 control / what                                                              |
|---------------------|--------------------------------------------------------------------------------|
| `forwarding.py`     | ``NetApproxIngress.forwarding``: routes_v4                                      |
| `classification.py` | ``NetApproxIngress.classification``: queue_by_class/job/tag/tlr                 |
| `ecn.py`            | ``NetApproxEgress.ecn``: ecn_thresholds                                         |
| `validation.py`     | ``NetApproxIngress.validation``: the malformed_packets drop counters            |
| `mirror.py`         | one table's installed copy, the diff engine, match/action encoders              |
| `p4info.py`         | P4Info lookups and the P4Runtime bytestring codec                               |
| `session.py`        | the gRPC session: StreamChannel, arbitration, Write, Read, packet-in            |
| `connection.py`     | ``SwitchConnection``: session + pipeline (cookie, push) + reconcile (read back) |
| `write_queue.py`    | ``WriteQueue``: every Write; the flow-controlled queue_by_job queue             |
| `tm.py`             | ``TrafficManager``: queue buffers (BMv2 Thrift, Tofino BfRt), REPORT meter      |
| `counters.py`       | ``CounterReader``: per-queue, per-job, drop and guard counters in one Read      |
| `options.py`        | ``P4RuntimeOptions`` (the ``[switch.options]`` table)                           |
| `driver.py`         | ``P4RuntimeDriver``: the controls and the parts above, for one switch           |
| `bmv2_thrift.py`    | BMv2 queue depth/rate over Thrift (the controller and the PTF suite)            |
| `tofino_tm.py`      | Tofino traffic manager over BfRt                                                |
"""

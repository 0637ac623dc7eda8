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
| `session.py`        | the gRPC session: arbitration, pipeline, Write, Read, packet-in                 |
| `options.py`        | ``P4RuntimeOptions`` (the ``[switch.options]`` table)                           |
| `driver.py`         | ``P4RuntimeDriver``: the controls over one session                              |
| `bmv2_thrift.py`    | BMv2 queue depth/rate over Thrift (the controller and the PTF suite)            |
| `tofino_tm.py`      | Tofino traffic manager over BfRt                                                |
"""

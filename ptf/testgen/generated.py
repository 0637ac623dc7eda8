"""Runs the test cases p4testgen generated for the v1model program (ptf/testgen.py makes them) on the switch.

p4testgen (p4c's p4tools, ``--test-backend protobuf``) writes one ``p4testgen.TestCase`` text proto per path it
found through the parser and the controls: the table entries the path needs (P4Runtime entities), an input
packet and port, and the packet expected on each output port with a don't-care mask (none: the packet is
dropped). This test installs each case's entries, sends its packet (a packet-out when it enters on the CPU
port), checks every expected packet (a packet-in when it leaves on the CPU port: p4testgen sees the
``packet_in`` header the deparser emits, the switch sends it as metadata), that nothing else left, and removes
the entries again. One PTF test runs every case and writes ``results.json`` beside them (case, passed,
error), then fails if any case failed.

Test parameters (besides the suite's, ptf/tests/common/base_test.py): ``testgen_dir``, where the ``.txtpb``
cases are.
"""
from __future__ import annotations

import json
import pathlib
import sys
import traceback

import ptf.testutils as testutils
from ptf.mask import Mask

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import cases  # noqa: E402  (ptf/testgen/cases.py: the format)
from common.base_test import P4RuntimeTest  # noqa: E402  (ptf/tests/common)
from netapprox.controller.p4runtime.protos import p4runtime_pb2  # noqa: E402

WAIT_S = 2.0
"""Deadline for a packet that must come (BMv2 takes milliseconds)."""


def masked(expected: bytes, mask: bytes) -> Mask:
    """A ptf Mask of ``expected`` that ignores the bits ``mask`` leaves 0 (an empty mask: every bit counts)."""
    m = Mask(expected)
    for start, count in cases.dont_care_bits(mask, len(expected)):
        m.set_do_not_care(start, count)
    return m


class GeneratedPathsTest(P4RuntimeTest):
    """Every p4testgen case in ``testgen_dir``, one after another."""

    def runTest(self):
        directory = testutils.test_param_get("testgen_dir")
        if not directory:
            self.fail("test parameter testgen_dir is not set (ptf/testgen.py sets it)")
        directory = pathlib.Path(directory)
        results = []
        for name, case in cases.load_cases(directory):
            try:
                self.run_case(case)
                results.append({"case": name, "passed": True})
            except Exception as e:  # one case's failure is reported with the others, not instead of them
                detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                results.append({"case": name, "passed": False, "error": detail[-3000:],
                                "trace": list(case.traces)[-12:]})
            self.dataplane.flush()
            while self.get_packet_in(timeout=0) is not None:
                pass
        (directory / "results.json").write_text(json.dumps(results, indent=1))
        failed = [r for r in results if not r["passed"]]
        self.assertFalse(failed, f"{len(failed)} of {len(results)} generated cases failed: "
                         + "; ".join(f"{r['case']}: {r['error'][:300]}" for r in failed[:5]))

    # --- one case -----------------------------------------------------------------------------------
    def run_case(self, case) -> None:
        installed = []
        try:
            for entity in case.entities:
                installed.append(self.insert(self.canonical(entity)))
            self.send(case.input_packet.port, case.input_packet.packet)
            for out in case.expected_output_packet:
                if out.port == self.cpu_port:
                    self.expect_packet_in(out.packet, out.packet_mask)
                else:
                    testutils.verify_packet(self, masked(out.packet, out.packet_mask), out.port,
                                            timeout=WAIT_S)
            testutils.verify_no_other_packets(self)
            self.verify_no_packet_in(timeout=0.05)
        finally:
            for entity in reversed(installed):
                self.delete(entity)

    def canonical(self, entity):
        return cases.canonical_entity(entity, self.p4info)

    def send(self, port: int, packet: bytes) -> None:
        """On a data port as it is; on the CPU port as a packet-out (its packet_out header as metadata)."""
        if port != self.cpu_port:
            testutils.send_packet(self, port, packet)
            return
        self._stream_out.put(p4runtime_pb2.StreamMessageRequest(packet=cases.packet_out(packet, self.p4info)))

    def expect_packet_in(self, expected: bytes, mask: bytes) -> None:
        """The packet-in, its metadata put back in front as the deparser emits the header, against what
        p4testgen expects on the CPU port."""
        msg = self._get_stream("packet", WAIT_S)
        self.assertIsNotNone(msg, "no packet-in received")
        values = {m.metadata_id: int.from_bytes(m.value, "big") for m in msg.packet.metadata}
        frame = cases.packet_in_frame(msg.packet.payload, values, self.p4info)
        self.assertTrue(masked(expected, mask).pkt_match(frame),
                        f"packet-in differs:\nexpected {expected.hex()}\nmask     {mask.hex()}\ngot      {frame.hex()}")

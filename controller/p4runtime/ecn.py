"""Mirrors ``NetApproxEgress.ecn`` (p4src/*/include/control/ecn.p4): ``ecn_thresholds``."""
from __future__ import annotations

from netapprox.controller.p4runtime.protos import p4runtime_pb2

from netapprox.controller.model import EcnRule, SwitchState
from netapprox.controller.p4runtime.mirror import DesiredTables, TableMirror, action, exact, unique
from netapprox.controller.p4runtime.p4info import P4Info

ECN_THRESHOLDS = "NetApproxEgress.ecn.ecn_thresholds"
MARK_ECN = "NetApproxEgress.ecn.mark_ecn"


class Ecn:
    """``ecn_thresholds``: per logical queue, ``mark_ecn(threshold)``. Thresholds are in packets in
    ``SwitchState``; ``depth_unit`` converts to the target's queue-depth unit (Tofino: cells per packet)."""

    def __init__(self, p4info: P4Info, depth_unit: int = 1) -> None:
        self.ecn_thresholds = TableMirror(p4info, ECN_THRESHOLDS)
        self._qid = self.ecn_thresholds.info.field("qid")
        self._mark = self.ecn_thresholds.action_of(p4info, MARK_ECN)
        self._mark.param("threshold")
        self.depth_unit = depth_unit

    @property
    def tables(self) -> tuple[TableMirror, ...]:
        return (self.ecn_thresholds,)

    def desired(self, state: SwitchState) -> DesiredTables:
        rules = unique(state.ecn_rules, lambda r: r.qid, ECN_THRESHOLDS)
        return {self.ecn_thresholds: (rules, self._entry)}

    def _entry(self, r: EcnRule) -> p4runtime_pb2.TableEntry:
        return self.ecn_thresholds.entry([exact(self._qid, r.qid)],
                                         action(self._mark, threshold=r.depth_pkts * self.depth_unit))

"""One design, one set of defaults: what the simulation runs is what hostlib and every data plane default to.

Fails when a simulation default has no counterpart classified in ``experiments.sim.trial.SETTINGS_PARITY``, when
a design default (spraying, the approximate queues' sizing, every sender/receiver knob) differs between the
simulation, hostlib, the emulated testbeds and the drivers of the P4 and kernel switches, or when a trial
changes a knob other than through a named variant."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from netapprox.controller.config import PolicyConfig
from netapprox.controller.kernel.driver import KernelDriverOptions
from netapprox.controller.model import half_buffer_unit
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.experiments import atp_job
from netapprox.experiments.emulated import Scale, sprays
from netapprox.experiments.plans import ATP_ABLATION, ATP_VARIANTS
from netapprox.experiments.sim.trial import (
    SCALED_ATP_KNOBS, SETTINGS_PARITY, SimSettings, atp_config)
from netapprox.hostlib.config import AtpConfig
from netapprox.topo.testbed import TestbedConfig as TbConfig

DEFAULT = AtpConfig()
KNOBS = [f.name for f in dataclasses.fields(AtpConfig)]


def differing(cfg: AtpConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in KNOBS if getattr(cfg, k) != getattr(DEFAULT, k)}


def test_parity_every_simulation_default_is_classified():
    fields = {f.name for f in dataclasses.fields(SimSettings)}
    assert fields == set(SETTINGS_PARITY), (f"SimSettings fields without a SETTINGS_PARITY entry: "
                                            f"{sorted(fields - set(SETTINGS_PARITY))}; stale entries: "
                                            f"{sorted(set(SETTINGS_PARITY) - fields)}")
    assert {kind for kind, _ in SETTINGS_PARITY.values()} <= {"shared", "scaled", "baseline", "simulator"}
    assert {k for k, (kind, _) in SETTINGS_PARITY.items() if kind == "shared"} == {
        "spray", "approx_buffer_unit", "atp_receiver_grants"}


def test_parity_spraying_is_on_by_default_everywhere():
    sim = SimSettings().spray
    planes = {"controller policy (kernel, P4)": PolicyConfig().spray, "emulated testbed": TbConfig().spray,
              "emulated back end (atp)": sprays("atp")}
    assert all(v == sim for v in planes.values()), (sim, planes)
    assert not sprays("atp-flowhash") and ATP_ABLATION["atp-flowhash"]["spray"] is False  # the named variant


@pytest.mark.parametrize("buffer", [64, 92, 256, 1000])
def test_parity_one_approximate_queue_sizing_policy(buffer):
    sim = dataclasses.replace(SimSettings(), buffer_packets=buffer).approx_unit
    planes = {
        "ns-3": sim,
        "P4 (BMv2, Tofino)": P4RuntimeOptions(buffer_packets=buffer).approx_buffer_unit,
        "kernel": KernelDriverOptions(ports={"a": 1}, buffer_packets=buffer).approx_buffer_unit,
    }
    if buffer > 28:
        tb = TbConfig(buffer_packets=buffer)
        planes["emulated testbed (what its senders are told)"] = tb.queue_packets[1] // 7
    assert set(planes.values()) == {half_buffer_unit(buffer)}, planes


def test_parity_simulation_atp_is_hostlib_default_but_for_scaled_knobs():
    allowed = set(SCALED_ATP_KNOBS)
    sim = differing(atp_config(SimSettings(), "atp"))
    assert set(sim) <= allowed, f"the simulation changes unscaled knobs: {set(sim) - allowed}"
    for name, knobs in {**ATP_VARIANTS, **ATP_ABLATION}.items():  # a variant changes its own knobs only
        cfg = atp_config(SimSettings(), name)
        extra = set(differing(cfg)) - allowed - set(knobs)
        assert not extra, (name, extra)
    assert not atp_config(SimSettings(), "atp-nogrants").receiver_grants


def test_parity_the_testbeds_receivers_are_hostlibs_default_but_for_their_links_rate():
    rx = atp_job.receiver_config(argparse.Namespace(rate=f"{Scale().rate_mbit:g}M", grants=None))
    assert set(differing(rx)) == {"max_rate_bps"}, differing(rx)
    assert atp_job.receiver_config(argparse.Namespace(rate=None, grants="on")).receiver_grants  # a named variant


@pytest.mark.parametrize("sprays", [False, True])
def test_parity_emulated_atp_is_hostlib_default_but_for_scaled_knobs(sprays):
    tb = TbConfig()
    args = argparse.Namespace(mode="adaptive", no_mrdf=False, completion="early", rate=f"{Scale().rate_mbit:g}M",
                              queue_packets=",".join(map(str, tb.queue_packets)), report_key_file=None,
                              path_reorders=sprays)
    emu = differing(atp_job.build_config(args))
    assert set(emu) <= {"max_rate_bps", "queue_packets", "path_reorders"}, emu
    assert atp_job.build_config(args).path_reorders == sprays


def test_parity_every_fabric_that_sprays_tells_its_senders():
    """The simulation's senders are told when the fabric sprays (``path_reorders``), and so are the emulated
    leaf-spine's: a testbed sprays exactly when its topology is multi-path, its policy sprays and its switch is
    not FIFO (experiments.emulated passes ``--path-reorders`` then)."""
    assert atp_config(SimSettings(), "atp").path_reorders is SimSettings().spray is True
    assert not atp_config(SimSettings(), "atp-flowhash").path_reorders
    assert not atp_config(SimSettings(), "atp-reorderseen").path_reorders  # the named variant not told
    leafspine = dict(topology="leafspine", hosts=4, leaves=2, spines=2)
    assert TbConfig(**leafspine).sprays
    assert not TbConfig(**leafspine, spray=False).sprays
    assert not TbConfig(**leafspine, switch="fifo", controller=False).sprays
    assert not TbConfig().sprays  # one switch: nothing to spray over


def test_parity_a_variant_is_the_only_way_to_change_a_knob():
    with pytest.raises(ValueError, match="not scaled knobs"):
        import netapprox.experiments.sim.trial as trial
        saved = dict(trial.SCALED_ATP_KNOBS)
        try:
            del trial.SCALED_ATP_KNOBS["max_jobs"]
            trial.atp_config(SimSettings(), "atp")
        finally:
            trial.SCALED_ATP_KNOBS.clear()
            trial.SCALED_ATP_KNOBS.update(saved)

"""experiments/ddp.py without a testbed: time to accuracy, the ratios against gloo, the tables and the plot of a
result file (the network part itself needs root and ~40 minutes: python -m netapprox.experiments ddp)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib", reason="the ddp experiment's plots need matplotlib (make setup installs it)")

from netapprox.experiments import ddp  # noqa: E402
from netapprox.experiments import results as R  # noqa: E402
from netapprox.experiments.emulated import EmulatedBackend  # noqa: E402


def _curve(speed: float) -> list[dict]:
    return [{"iteration": i, "time_s": i * speed, "test_acc": min(0.97, 0.1 + 0.01 * i), "train_acc": 0.9,
             "test_loss": 0.2, "train_loss": 0.2} for i in range(0, 150, 5)]


def test_ddp_time_to_accuracy_is_the_first_evaluation_at_the_target():
    curve = _curve(0.2)
    assert ddp.time_to_accuracy(curve, 0.9) == 80 * 0.2
    assert ddp.time_to_accuracy(curve, 0.99) is None
    assert ddp.scenario_flow_load("ws50") == 0.5 and ddp.scenario_flow_load("straggler") == 0.0


def test_ddp_tables_and_plot_of_a_result_file(tmp_path):
    rf = R.ResultFile("ddp", {"variants": ["gloo", "atp"], "scenarios": ["idle", "straggler"], "target_test_acc": 0.9,
                              "fill": {"modes": [], "loss": 0.3, "policy": "msr:0.5"}}, [1, 2], tmp_path / "ddp")
    for seed in (1, 2):
        for scenario, slow in (("idle", 1.0), ("straggler", 2.0)):
            for variant, speed in (("gloo", 0.3), ("atp", 0.2)):
                curve = _curve(speed * slow)
                m = {"failed": False, "final_test_acc": curve[-1]["test_acc"] - (0.004 if variant == "atp" else 0),
                     "iteration_mean_s": speed * slow / 5, "replicas_identical": True,
                     "time_to_target_s": ddp.time_to_accuracy(curve, 0.9)}
                if variant == "atp":
                    m.update(lost_value_frac=0.1, gather_zeroed_frac=0.2, group_bound_held=True)
                rf.add(seed, {"part": "network", "scenario": scenario, "variant": variant}, m, {"curve": curve})
            base = ddp._find(rf, seed, scenario, "gloo")
            run = ddp._find(rf, seed, scenario, "atp")
            assert base is not None and run is not None
    rf.write()
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    text = ddp.tables(result)
    assert "| idle | atp | 16 [16, 16] | 0.966 [0.966, 0.966] |" in text
    assert "| straggler | gloo | 48 [48, 48] |" in text
    path = ddp.plot_accuracy(rf, path=tmp_path / "acc.png")
    assert path is not None and path.stat().st_size > 1000


def test_ddp_experiment_rejects_unknown_variants_and_scenarios(tmp_path):
    with pytest.raises(ValueError, match="unknown variant or scenario nope"):
        ddp.exp_ddp([1], tmp_path, EmulatedBackend(), variants=("gloo", "nope"), fills=(), network=False)
    with pytest.raises(ValueError, match="quiet"):
        ddp.exp_ddp([1], tmp_path, EmulatedBackend(), scenarios=("quiet",), fills=(), network=False)

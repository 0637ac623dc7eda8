"""The "At data-center scale (ns-3)" section of docs/results.md comes from results/sim/<name>/result.json."""
from __future__ import annotations

import pytest

from netapprox.experiments import report
from netapprox.experiments import results as R


def _alltoall(res, run="alltoall", topo="k=4 fat-tree"):
    rf = R.ResultFile(f"sim-{run}", {"workloads": ["fbkv"], "msrs": [0.5],
                                     "settings": {"topology": {"description": topo}}},
                      [1, 2], res / "sim" / run, command=["python", "-m", "netapprox.experiments", "sim", "alltoall"])
    for seed, (atp, es, ss) in ((1, (100e-6, 200e-6, 150e-6)), (2, (120e-6, 200e-6, 100e-6))):
        for proto, jct in (("atp", atp), ("dctcp-es", es), ("dctcp-ss", ss)):
            rf.add(seed, {"workload": "fbkv", "msr": 0.5, "protocol": proto}, {"jct_mean_s": jct, "msr_met_frac": 1.0})
        rf.add(seed, {"workload": "fbkv", "msr": 0.5, "protocol": "atp/dctcp-es"}, {"jct_ratio": atp / es})
        rf.add(seed, {"workload": "fbkv", "msr": 0.5, "protocol": "atp/dctcp-ss"}, {"jct_ratio": atp / ss})
    rf.write()
    R.plot_lines(R.summarize(rf.runs), metric="jct_mean_s", x="msr", series="protocol",
                 path=rf.out_dir / "jct_fbkv.png", title="t", xlabel="MSR", ylabel="s")


def test_sim_section_tables_headline_and_plots(tmp_path):
    res = tmp_path / "results"
    _alltoall(res)
    text = report.render(res, tmp_path / "docs" / "results.md", tmp_path / "docs" / "img")
    assert "## At data-center scale (ns-3)" in text
    assert "| workload | msr | protocol | jct_mean_us | jct_ratio | msr_met_frac |" in text
    assert "| fbkv | 0.500 | atp | 110.0 [100.0, 120.0] | – | 1.000 (n=2) |" in text
    # per-seed ratios: 0.5 and 0.6 against ES; 0.667 and 1.2 against SS
    assert "MSR 0.5: 0.55 [0.50, 0.60] / 0.93 [0.67, 1.20]" in text
    assert "(img/sim_alltoall_jct_fbkv.png)" in text and (tmp_path / "docs" / "img" / "sim_alltoall_jct_fbkv.png").exists()


def test_tagged_runs_get_their_own_table_and_headline(tmp_path):
    res = tmp_path / "results"
    _alltoall(res)
    _alltoall(res, "alltoall-k8", "k=8 fat-tree")
    text = report.render(res, tmp_path / "docs" / "results.md", tmp_path / "docs" / "img")
    assert text.index("### All-to-all JCT vs MSR and queue length (Fig. 5-8)\n") < text.index(
        "### All-to-all JCT vs MSR and queue length (Fig. 5-8) — k8")
    assert "All-to-all FBKV (k=4 fat-tree)" in text and "All-to-all FBKV (k=8 fat-tree)" in text
    assert (tmp_path / "docs" / "img" / "sim_alltoall_k8_jct_fbkv.png").exists()


def test_no_sim_results_no_section(tmp_path):
    text = report.render(tmp_path / "results", tmp_path / "results.md", tmp_path / "img")
    assert "ns-3" not in text


def test_sim_cli_overrides_follow_the_experiment_signature():
    from netapprox.experiments.cli import UsageError, parse_overrides
    from netapprox.experiments.figures import exp_alltoall, exp_coexist
    from netapprox.experiments.sim_cli import set_checks
    checks = set_checks()
    assert parse_overrides(["msrs=0.5,0.9", "protocols=atp,dctcp-es"], exp_alltoall, checks) == {
        "msrs": (0.5, 0.9), "protocols": ("atp", "dctcp-es")}
    assert parse_overrides(["window_ms=1.5"], exp_coexist, checks) == {"window_ms": 1.5}
    with pytest.raises(UsageError, match="protocols: 'tcp-es' is not one of"):
        parse_overrides(["protocols=tcp-es"], exp_alltoall, checks)
    with pytest.raises(UsageError, match="msrs"):
        parse_overrides(["msrs=1.5"], exp_alltoall, checks)
    from netapprox.experiments.figures import exp_fairness, fairness_scheme
    # fairness schemes: a protocol, alone-<atp>, or <atp>+<a policy setting of the shifting workload>
    assert parse_overrides(["schemes=alone,atp,atp+adaptive,atp-full+fixed-k8"], exp_fairness, checks) == {
        "schemes": ("alone", "atp", "atp+adaptive", "atp-full+fixed-k8")}
    assert fairness_scheme("atp-full+fixed-k8") == ("atp-full", False, (("mode", "netapprox"),
                                                                       ("thresholds", tuple(k / 8 for k in range(8))),
                                                                       ("finish_epochs", 0.0)))
    for bad, named in (("atp+nope", "'nope' is not one of"), ("dctcp-es+adaptive", "'dctcp-es' is not one of"),
                       ("quic", "'quic' is not one of")):
        with pytest.raises(UsageError, match=named):
            parse_overrides([f"schemes={bad}"], exp_fairness, checks)


def test_sim_cli_mistakes_are_one_line(capsys):
    from netapprox.experiments.sim_cli import main
    for argv, named in ((["alltoall", "--k", "three"], "--k"), (["alltoall", "--buffer-packets", "10"], "--buffer-packets"),
                        (["alltoall", "--set", "protocols=quic"], "quic"), (["alltoall", "--set", "nope=1"], "nope")):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code
        err = capsys.readouterr().err.strip()
        assert status == 2 and len(err.splitlines()) == 1 and named in err, (argv, err)

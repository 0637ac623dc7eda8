"""ml/replay.py: the bounded hook's arithmetic without a network reproduces stock training where it should."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'netapprox[torch]' (make setup does)")

from netapprox.ml import example, replay  # noqa: E402

pytestmark = pytest.mark.slow


def test_replay_gloo_is_the_examples_training():
    """The replay's three replicas train as the example's three gloo workers do: the same curve to float
    rounding (gloo's ring adds in another order), so its iteration counts are the example's."""
    cfg = replay.ReplayConfig(variant="gloo", iterations=10, eval_every=5, hidden=64)
    mine = replay.replay(1, cfg)
    theirs = example.run_local(3, example.TrainConfig(hook="gloo", iterations=10, eval_every=5, hidden=64,
                                                      seed=1), timeout_s=240)[0]["curve"]
    theirs = [c for c in theirs if c["iteration"] > 0]
    assert [c["iteration"] for c in mine] == [c["iteration"] for c in theirs] == [5, 10]
    for a, b in zip(mine, theirs):
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1.5 / 360)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-3)


def test_replay_bounded_leaves_values_out_and_the_fill_matters():
    cfg = replay.ReplayConfig(iterations=10, eval_every=5, hidden=64, floor_from=2)
    gloo = replay.replay(2, dataclasses.replace(cfg, variant="gloo"))
    zero = replay.replay(2, dataclasses.replace(cfg, gather_fill="zero"))
    predicted = replay.replay(2, cfg)
    assert zero != gloo and predicted != zero
    assert replay.iterations_to(gloo, 0.0) == 5 and replay.iterations_to(gloo, 1.01) is None
    with pytest.raises(ValueError, match="gather_fill"):
        replay.replay(1, dataclasses.replace(cfg, gather_fill="mean"))


def test_replay_command_line(capsys):
    assert replay.main(["--seeds", "3", "--iterations", "10", "--straggler", "--target", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "seed 3: iterations to 50%" in out and "predicted" in out
    with pytest.raises(SystemExit):
        replay.main(["--seeds", "x-y"])
    assert "--seeds 'x-y'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replay.main(["--gather-fill-decay", "1"])
    assert "--gather-fill-decay 1.0: must be in [0, 1)" in capsys.readouterr().err

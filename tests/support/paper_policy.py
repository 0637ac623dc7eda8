"""The policy with the paper's k/8 TLR thresholds, for tests that work out queues by hand for them.

The default policy's thresholds are ``model.POLICY_THRESHOLDS`` (docs/controller.md, The default policy); the
mechanisms these tests check (hysteresis, promotion, expiry, the table writes, failover) are the same for any
thresholds, and their expected queues are written for T_k = k/8."""
from __future__ import annotations

from typing import Any

from netapprox.controller.config import ControllerConfig as _ControllerConfig
from netapprox.controller.config import PolicyConfig as _PolicyConfig
from netapprox.controller.model import DEFAULT_THRESHOLDS

PAPER_TOML = "thresholds = [" + ", ".join(repr(t) for t in DEFAULT_THRESHOLDS) + "]"
"""The same in a ``[policy]`` table of a TOML file."""


def PolicyConfig(**kw: Any) -> _PolicyConfig:  # noqa: N802 (stands in for the class)
    """``PolicyConfig`` with ``thresholds`` k/8 unless given."""
    return _PolicyConfig(**{"thresholds": DEFAULT_THRESHOLDS, **kw})


def ControllerConfig(**kw: Any) -> _ControllerConfig:  # noqa: N802 (stands in for the class)
    """``ControllerConfig`` whose policy has ``thresholds`` k/8 unless given."""
    return _ControllerConfig(**{"policy": PolicyConfig(), **kw})

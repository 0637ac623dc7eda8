"""Machine-learning frameworks on ApproxLib: a PyTorch DistributedDataParallel hook that reduces gradients
over ATP (``netapprox.ml.register(ddp_model)``), with gradient group policies and CadentFlow tags.

``netapprox.ml.policy``, ``layout`` and ``vectors`` need only numpy; ``hook`` and ``example`` need PyTorch
(the ``[torch]`` extra: ``pip install 'netapprox[torch]'``). docs/ml.md has the design and the measurements.
"""
from __future__ import annotations

from typing import Any


def register(ddp_model: Any, **options: Any) -> Any:
    """Turn on the ATP hook for ``ddp_model`` (see :func:`netapprox.ml.hook.register`)."""
    try:
        from netapprox.ml.hook import register as _register
    except ModuleNotFoundError as err:
        if err.name == "torch":
            raise ModuleNotFoundError("netapprox.ml.register needs PyTorch: pip install 'netapprox[torch]'",
                                      name="torch") from None
        raise
    return _register(ddp_model, **options)

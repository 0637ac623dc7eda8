"""NetApprox control plane: keeps every switch's queue mapping in step with the jobs' instantaneous slack.

Public API (docs/controller.md): ``controller.loop.Controller`` / ``EpochResult``, ``controller.config``
(``ControllerConfig``, ``load_config``), ``controller.policy.decide`` (the pure policy), the driver registry
``controller.drivers.build_driver``, and the drivers ``controller.p4runtime_driver.P4RuntimeDriver`` and
``controller.kernel_driver.KernelDriver``.
"""

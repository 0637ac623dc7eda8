"""NetApprox control plane: keeps every switch's queue mapping in step with the jobs' instantaneous slack.

Layout (docs/architecture.md): the model (``model``: ``SwitchState`` and its rule types, the TLR -> queue
mapping), the reference model of the logical tables (``reference``), the policy (``policy``), report intake
(``reports``), configuration (``config``), errors (``errors``), observation (``observe``); the sans-I/O epoch
core (``core.ControllerCore``) and the one runtime that does its I/O (``runtime.Runtime``); the driver
interface and registry (``drivers``); one subpackage per data plane: ``p4runtime/`` (BMv2, Tofino) and
``kernel/`` (the Linux kernel switch). ``python -m netapprox.controller --config FILE`` runs it.
"""

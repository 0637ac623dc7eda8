"""The simulated data plane (ns-3): the switch queue disc (``netapprox_switch.h``), its loader (``native``) and
the controller's driver for it (``driver.SimDriver``, kind ``sim``). docs/simulation.md."""

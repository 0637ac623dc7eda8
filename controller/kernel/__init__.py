"""The Linux kernel switch as a NetApprox data plane (``kind = "kernel"``).

| module        | what                                                                           |
|---------------|--------------------------------------------------------------------------------|
| `compiler.py` | pure: a ``SwitchState`` -> u32 entries (the logical tables as a node-id layout) |
| `tc.py`       | the per-port HTB strict-priority tree and the u32 classifier, through pyroute2  |
| `stamp.py`    | the eBPF queue stamper and queue 0's ECN marking (`stamp.bpf.c`)                 |
| `driver.py`   | ``KernelDriver``: connect / apply (diff) / read_counters over the three above    |

The switch itself (a bridge in a network namespace, or a Mininet ``KernelSwitch``) is started by topo/.
"""

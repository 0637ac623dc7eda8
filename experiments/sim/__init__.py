"""The NetApprox experiments at data-center scale, simulated in ns-3 (docs/simulation.md).

``python -m netapprox.experiments sim <name>``; ``world`` runs one trial, ``runner`` the experiments,
``topology`` builds fat-trees and Clos networks. Needs the ``sim`` extra (ns-3 from PyPI), not root.
"""

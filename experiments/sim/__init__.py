"""The ns-3 back end of the experiments: the same figures at data-center scale (docs/simulation.md).

``python -m netapprox.experiments sim <name>``; ``backend`` runs a figure's trial plans (``SimBackend``,
``SimScale``), ``trial`` is one simulated trial, ``topology`` builds fat-trees and Clos networks, ``native``
loads ns-3 with the C++ the simulations add. Needs the ``sim`` extra (ns-3 from PyPI), not root.
"""

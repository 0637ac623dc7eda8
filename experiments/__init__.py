"""Experiments that reproduce the evaluation of the NetApprox, bounded-loss and DDNN-priority papers.

``python -m netapprox.experiments --help`` lists one subcommand per experiment; docs/experiments.md describes
the workloads, the baselines, the scale and how to read the results.
"""

"""A discrete-event simulator of peerd's averaging at 64–1024 peers.

It drives peerd's own pure cores (topology, groups, segments, partition, lr,
membership, deadline) with a virtual clock; every simulated peer holds real
parameters and takes real SGD steps. `python -m peerd.sim --help` runs it.
"""

from peerd.sim.algorithms import ALGORITHMS
from peerd.sim.config import SimConfig
from peerd.sim.network import NetworkSpec, Tier
from peerd.sim.runner import Result, Simulation, simulate
from peerd.sim.schedule import parse_schedule

__all__ = ["ALGORITHMS", "NetworkSpec", "Result", "SimConfig", "Simulation", "Tier", "parse_schedule", "simulate"]

"""Wrappers over benchmax-gym environments (installed as ``benchmax_gym.wrappers``)."""

from .ray_vector import RayVectorEnv
from .record import RecordEpisodes
from .vector import SubprocVectorEnv

__all__ = ["RayVectorEnv", "RecordEpisodes", "SubprocVectorEnv"]

"""SkyRL entrypoint that registers the ``benchmax`` env class, then trains (SkyRL's main).

Run from a SkyRL checkout (SkyRL 0.4's trainer is PyPI's ``skyrl``, Python >= 3.12), with this
package installed in its environment (``uv pip install 'benchmax-gym[skyrl]'``);
``examples/skyrl_math.sh`` has the whole command. The CPU smoke version the tests run is ``examples/skyrl_smoke.py``.
"""

import sys

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp, validate_cfg
from skyrl.train.utils import initialize_ray


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg: SkyRLTrainConfig):
    import benchmax_gym.adapters.skyrl  # noqa: F401  (registers "benchmax" in this Ray worker)

    BasePPOExp(cfg).run()


def main() -> None:
    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()

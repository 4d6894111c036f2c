"""asyncdist on Ray: ranks as Ray actors (``pip install "asyncdist[ray]"``).

Ray places the processes (a placement group, packed or spread), and asyncdist
connects them: rank 0's actor serves the store, its address travels as a Ray
object, and every rank joins an asyncdist world in its own actor. Functions
run on every rank from the driver::

    import ray
    from asyncdist.ray import ray_world

    ray.init(num_cpus=4)
    with ray_world(4, strategy="SPREAD") as world:
        async def step(pg):                  # the await API, on the actor's loop
            x = np.full(2, float(pg.rank))
            await pg.all_reduce(x)
            return x
        print(world.run(step))

After a killed actor, the survivors' async functions call
``await asyncdist.ray.shrink(pg)`` and go on; an actor that Ray restarted
(``max_restarts``) comes back by ``world.rejoin(actor)`` while they call
``await asyncdist.ray.grow(pg, min_joiners=1)``. Rank 0's actor serves the
store and must survive (docs/ray.md, "Surviving a killed actor").

For Ray Train, no code of this package is needed: ``TorchTrainer(...,
torch_config=TorchConfig(backend="asyncdist"))`` runs DDP over asyncdist's
torch backend (see docs/ray.md).

Importing this package imports Ray; nothing else in asyncdist does.
"""

from __future__ import annotations

from .rank import grow, shrink
from .world import RayWorld, ray_world

__all__ = ["RayWorld", "grow", "ray_world", "shrink"]

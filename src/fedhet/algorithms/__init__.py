"""fedhet.algorithms: every algorithm registers itself in `ALGORITHMS` (base.py) when its module
is imported, and importing this package imports them all. A new algorithm is a module here plus
its name below; a user's own is registered with `ALGORITHMS.register` in their code."""

from fedhet.algorithms import (  # noqa: F401  (imported for their registrations)
    bherd,
    central,
    fedavg,
    fednnnn,
    fednova,
    fedprox,
    fedveca,
    grab,
    hierarchical,
    moon,
    scaffold,
)

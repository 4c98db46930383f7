"""fedhet.algorithms: every algorithm registers itself in `ALGORITHMS` (base.py) when its module
is imported, and importing this package imports every module in it. A new algorithm is a new
module here; a user's own is registered with `ALGORITHMS.register` in their code."""

from fedhet.registry import import_all

import_all(__name__, __path__)

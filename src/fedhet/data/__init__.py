"""Datasets, generators and partitioners. The loader modules register themselves in `DATASETS`
(registry.py) and the partitioners in `PARTITIONS` (partition.py) when imported; importing this
package imports every module in it."""

from fedhet.registry import import_all

import_all(__name__, __path__)

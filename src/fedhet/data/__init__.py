"""Datasets, generators and partitioners. The loader modules register themselves in `DATASETS`
(registry.py) and the partitioners in `PARTITIONS` (partition.py) when imported; importing this
package imports every module in it.

What it offers the layers above (runs, reports, papers, deploy, the CLI) is the list below; every other
name in the package is internal to it (tests/test_architecture.py).
"""

from fedhet.data.base import Dataset
from fedhet.data.files import absolute, is_data_path
from fedhet.data.index_map import write_index_map
from fedhet.data.partition import label_counts
from fedhet.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "Dataset",
    "absolute",
    "is_data_path",
    "label_counts",
    "write_index_map",
]

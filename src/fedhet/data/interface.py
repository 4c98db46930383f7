"""The data layer (datasets, generators and partitioners) as the layers above see it.

`fedhet.experiments`, `fedhet.deploy` and `fedhet.cli` import this layer only from here, as a
user's code imports fedhet only from `fedhet/__init__.py`; every other name in
`fedhet.data` is internal to it (tests/test_architecture.py).
"""

from fedhet.data.base import Dataset
from fedhet.data.files import absolute, is_data_path
from fedhet.data.partition import label_counts, write_index_map

__all__ = [
    "Dataset",
    "absolute",
    "is_data_path",
    "label_counts",
    "write_index_map",
]

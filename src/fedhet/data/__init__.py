"""Datasets, generators and partitioners. The loader modules register themselves in `DATASETS`
(registry.py) and the partitioners in `PARTITIONS` (partition.py) when imported; importing this
package imports them all."""

from fedhet.data import embedded, images, partition, synthetic  # noqa: F401  (registrations)

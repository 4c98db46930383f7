"""FedSR's ξ and α partitions (§IV-C) against its words (`papers.partition_readings`)."""

from __future__ import annotations

from fedhet.papers.fedsr.preset import partitions
from fedhet.papers.partition_readings import PartitionReading

IID = "\"For the iid setting, we divide the training set randomly and equally to all devices.\""
PATHOLOGICAL = ("\"The pathological distribution is divided by sorting the labels according to the "
                "training set, and slicing these labels into equal-sized shares, and then the device "
                "randomly selects ξ shares from them. Therefore, in the pathological distribution "
                "setting, most of the devices contain only ξ categories\"")
DIRICHLET = ("\"In the Dirichlet partitioning approach, we sample p_i ∼ Dir_K(α) and assign a p_i,k "
             "proportion of the samples from class i to device k.\"")
SHARDS = ("20 × ξ shares of the label-sorted data (sizes differ by at most 1), ξ random shares a "
          "device (`shards`), the text's own rule; within a label the order is random")
DIR = ("per class i, p_i ~ Dir(α·1_20) over the 20 devices (K = 20 devices, every concentration α), "
       "the text's rule; every device at least 10 samples, the whole draw repeated until one fits "
       "(`method=redraw`). The text gives no minimum, the one choice it leaves open, and it does not "
       "change this split: at seed 0 the first draw already fits, so the split with no minimum "
       "(`min_size=0`) is the same one (checked in tests/test_partition_readings.py), and over 200 "
       "draws on MNIST's class sizes a draw with no minimum left a device under 10 samples 0 times "
       "at α = 0.3 and 4 times at α = 0.1; no other split is read from these words, so no "
       "alternative cells run")
RINGS = ("devices go to the 5 rings (edge servers) in index order, 4 each; the text: \"uniformly "
         "distributed across edge servers\"")


def _choices(name: str) -> tuple[str, ...]:
    if name == "IID":
        return ("a random, even share", RINGS)
    return (SHARDS if name.startswith("xi") else DIR, RINGS)


def _words(name: str) -> str:
    return IID if name == "IID" else PATHOLOGICAL if name.startswith("xi") else DIRICHLET


LABEL_CUT = ("the other reading of \"most of the devices contain only ξ categories\": each label "
             "sliced into its own shares (equal within a label, the 40 shared among the labels by "
             "their sizes; `shards`, `cut=label`), so every device holds at most ξ labels", RINGS)

READINGS = (
    *(PartitionReading(f"fedsr-mnist-{name.replace('=', '').replace('.', '')}", f"FedSR MNIST {name}",
                       _words(name), "§IV-C", {"dataset": "mnist", "clients": 20, "seed": 0, **settings},
                       _choices(name))
      for name, settings in partitions("MNIST")),
    PartitionReading("fedsr-mnist-xi2-cutlabel", "FedSR MNIST xi=2 (cut=label), alternative",
                     PATHOLOGICAL, "§IV-C",
                     {"dataset": "mnist", "clients": 20, "seed": 0, "partition": "shards",
                      "partition.xi": 2, "partition.cut": "label"}, LABEL_CUT,
                     ("fedsr-mnist", "MNIST xi=2 (cut=label)")),
)
"""Table II's five MNIST partitions (20 devices, seed 0)."""

__all__ = ["READINGS"]

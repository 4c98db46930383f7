"""FedNNNN's four partitions (§5.1) against its words (`papers.partition_readings`)."""

from __future__ import annotations

from fedhet.papers.fednnnn.preset import partition_settings
from fedhet.papers.partition_readings import PartitionReading

WORDS = {
    "IID": "\"For i) IID, clients possess images of all of the defined classes in the dataset.\"",
    "NonIID": "\"for ii) non-IID, clients have images of only 2 classes (the minimum number of classes "
              "that allow meaningful learning).\"",
    "B": "\"For the iii) balanced condition, all clients have dataset of the same size.\"",
    "UB": "\"iv) unbalanced condition assumes that the dataset sizes of the clients follows a "
          "power-law distribution, where a small number of clients hold most of the training "
          "images.\"",
}
"""§5.1's words, by the two halves of a scenario's name."""

SHARDS = ("non-IID: the label-sorted data cut into 100 × 2 equal shards, 2 random shards a client "
          "(`shards`, ξ = 2), so a shard straddling two labels gives a client 3 or 4 and two shards of "
          "one label give it 1; the text's \"only 2 classes\" does not say how classes are drawn")
POWER = ("unbalanced: sizes ∝ r^(−1) over the size rank r (`unbalanced`, exponent 1, at least 10 "
         "samples), given to the clients in random order; the text names no exponent")
UB_SHARDS = ("non-IID-UB: each client's size cut into 2 shards laid along the label-sorted data, so "
             "a shard longer than what is left of a class runs on into the next label; the text does "
             "not say how a client larger than two classes' worth (the largest holds about 11,000 "
             "samples, a class about 6,000) keeps to 2 classes; the other reading is drawn and run "
             "beside it (`cut=label`)")
WEIGHTS = "the server weights every client 1/m (\"set n_k/n = 1/n\"), as the text says"


def _reading(scenario: str, choices: tuple[str, ...]) -> PartitionReading:
    labels, sizes = scenario.split("-")
    return PartitionReading(
        f"fednnnn-{scenario.lower()}", f"FedNNNN MNIST {scenario}", f"{WORDS[labels]} {WORDS[sizes]}", "§5.1",
        {"dataset": "mnist", "clients": 100, "seed": 0, **partition_settings(scenario)}, choices)


LABEL_CUT = ("the other reading of \"only 2 classes\": each label cut into its own shards "
             "(`shards`, `cut=label`), so no shard straddles two labels and a client holds 1 or 2")

UB_LABEL_CUT = ("the other reading of \"only 2 classes\" under UB: every client, large or small, holds "
                "exactly 2 classes (`unbalanced`, `cut=label`): clients from the largest down take "
                "the 2 classes with the most samples not yet asked for, half their size from each, "
                "and each class is shared among its holders in proportion to what they asked, so "
                "every sample is used and a size stays within about 1 % of its power-law value")

READINGS = (
    _reading("IID-B", ("IID: a random, even share",)),
    _reading("NonIID-B", (SHARDS,)),
    PartitionReading("fednnnn-noniid-b-cutlabel", "FedNNNN MNIST NonIID-B (cut=label), alternative",
                     f"{WORDS['NonIID']} {WORDS['B']}", "§5.1",
                     {"dataset": "mnist", "clients": 100, "seed": 0, **partition_settings("NonIID-B"),
                      "partition.cut": "label"}, (LABEL_CUT,),
                     ("fednnnn-mnist", "MNIST NonIID-B (cut=label)")),
    _reading("IID-UB", (POWER, "IID labels: a random permutation cut at those sizes", WEIGHTS)),
    _reading("NonIID-UB", (POWER, UB_SHARDS, WEIGHTS)),
    PartitionReading("fednnnn-noniid-ub-cutlabel", "FedNNNN MNIST NonIID-UB (cut=label), alternative",
                     f"{WORDS['NonIID']} {WORDS['UB']}", "§5.1",
                     {"dataset": "mnist", "clients": 100, "seed": 0, **partition_settings("NonIID-UB"),
                      "partition.cut": "label"}, (POWER, UB_LABEL_CUT, WEIGHTS),
                     ("fednnnn-mnist", "MNIST NonIID-UB (cut=label)")),
)
"""The four partitions of Table 2 (MNIST, 100 clients, seed 0)."""

__all__ = ["READINGS"]

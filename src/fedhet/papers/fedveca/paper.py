"""FedVeca as a paper folder declares it: its page sections, the meaning of its setups, and its
campaign table (Fig. 3, CNN + MNIST Case 3), whose fair baselines follow the recorded FedVeca run."""

from __future__ import annotations

from pathlib import Path

from fedhet.papers.fedveca import preset
from fedhet.papers.fedveca.page import sections
from fedhet.papers.folder import Paper, Prepare, Table
from fedhet.runs import RunSpec

SETUPS = ("ref40: reference [40]'s (pixels in [0, 1], no bias, zero start, B = 100); fedhet: "
          "standardised pixels, a bias")
"""What the preset's setups change (its SVM runs)."""

EVAL = {"train_loss": False}
"""FedVeca §IV-B computes "the loss function values and prediction accuracy values" of each
round's model "on the test dataset": no pass over the 60,000 training samples (a third of a
CNN round's time in the preset, which logs the training loss for its SVM figures)."""


def headline(s: RunSpec) -> bool:
    """Case 3: the cell of the paper's main claim."""
    return s.group.endswith("Case 3")


def baselines(scale: str, records: Path, prepare: Prepare) -> dict[str, list[RunSpec]]:
    """The fair baselines of each group whose FedVeca run is recorded under `records`
    (`{fedveca run name: specs}`); they take their budget from that run (§IV-A1)."""
    out: dict[str, list[RunSpec]] = {}
    for g in preset.groups(scale):
        specs = prepare(preset.fedveca_specs(g))
        if not specs or not (records / specs[0].name / "summary.json").exists():
            continue
        out[specs[0].name] = prepare(preset.baseline_specs(g, records, write=False))
    return out


PAPER = Paper(
    title="FedVeca", page=1, sections=sections, setup_help=SETUPS,
    tables=(
        Table("fedveca-cnn-mnist", "fedveca", "cnn-mnist", "FedVeca Fig. 3, CNN + MNIST Case 3",
              ("mnist",), headline, paper_seeds=10, order=30, extra_columns=("tau_k",),
              keep=lambda s: s.group.endswith("Case 3") and not s.group.startswith("SVM"),
              overrides=EVAL, later=baselines,
              deviations="loss and accuracy on the test set only, as §IV-B says (the preset also "
                         "logs the training loss)"),
    ),
)

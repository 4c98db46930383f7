"""BHerd (herding of local gradients): preset, Fig. 4 plots and report figures, and the
multi-seed study of eqs. 6–7's readings (`readings`)."""

from fedhet.papers.bherd import figures, preset  # noqa: F401  (registrations)

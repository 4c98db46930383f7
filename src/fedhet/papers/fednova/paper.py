"""FedNova as a paper folder declares it: its page sections (no campaign table: its runs are
small enough for `fedhet reproduce fednova --scale paper`)."""

from fedhet.papers.fednova.page import sections
from fedhet.papers.folder import Paper

PAPER = Paper(title="FedNova", page=3, sections=sections)

"""The campaign: the papers' tables at their published scale, accumulated across machines.

- `tables`: the tables, their headline cells and the order of their runs;
- `records`: records of finished runs in the repository, run directories in a cache,
  checkpoints that travel;
- `pricing`: a run's cost on a device kind, from measurements only;
- `bench`: the measurements a device kind's prices start from;
- `order`: the order a CPU sitting takes runs in (the most claim per core-hour first);
- `sitting`: one sitting (`fedhet reproduce all`);
- `plan`: the plan as a table (`fedhet reproduce plan`).
"""

from fedhet.papers.campaign.records import Store, default_cache
from fedhet.papers.campaign.sitting import command, default_tables, run_campaign
from fedhet.papers.campaign.tables import TABLES, Table, plan_runs, table

__all__ = ["TABLES", "Store", "Table", "command", "default_cache", "default_tables", "plan_runs",
           "run_campaign", "table"]

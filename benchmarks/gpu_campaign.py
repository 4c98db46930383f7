"""The prepared GPU sitting: measure what the campaign's GPU prices assume, then run cells.

On a lent GPU machine (a copy of the checkout, MNIST carried in the git-ignored `data/`):

    python benchmarks/gpu_campaign.py --out "$OUT" --minutes 9

1. **Measure** (`fedhet.papers.campaign.bench.GPU_WORKLOADS`, a few minutes on one H100):
   the FedNNNN CNN round over 100 clients (bf16 with 1 and 4 runs stacked; fp32 with 1), the
   MLP round over 100 clients, a FedSR ring round with 1 and 8 runs stacked, BHerd's 5-client
   CNN with 8 and 20 runs stacked. Written to `results/campaign/bench/cuda.json` (skipped when
   that record exists, unless `--remeasure`).
2. **Run cells** in the plan's order for what is left of `--minutes`: a campaign sitting on
   `cuda` (runs that share data and model stepped as one stack), records and travelling
   checkpoints written under `results/campaign/`.
3. **Bring back**: what this call wrote under `results/` goes into `--out` as one
   `results.tar.gz` (the tool brings back at most 8 files, 2 folders down), with the regenerated
   `paper-scale.md` and `removed.txt` (the files the call deleted, travelling checkpoints of
   runs it finished); unpack the archive over the checkout (`tar -xzf results.tar.gz`), delete
   what `removed.txt` names, copy the page into `docs/` and commit.

Only torch, NumPy and the standard library are needed (no tqdm, Flower, Ray, TensorBoard).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main(argv: list[str] | None = None) -> int:
    from fedhet.errors import FedhetError
    from fedhet.papers.campaign import bench, records
    from fedhet.papers.campaign.records import Store
    from fedhet.papers.campaign.sitting import run_campaign
    from fedhet.runs.results import git_commit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, required=True, help="where results/ is copied at the end ($OUT)")
    ap.add_argument("--minutes", type=float, default=9.0, help="the whole call's budget (default 9)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--remeasure", action="store_true", help="measure even when cuda.json exists")
    ap.add_argument("--tables", default=None, help="comma-separated campaign tables (default: all)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    before = _stamps(a.results)
    store = Store(a.results, Path("/tmp/fedhet-campaign-cache"))
    try:
        target = store.bench_dir / f"{bench.kind_of(a.device)}.json"
        if a.remeasure or not target.exists():
            rows = bench.measure(a.device, bench.GPU_WORKLOADS, a.data_dir,
                                 lambda line: print(line, flush=True))
            print(f"bench record: {bench.record(store, a.device, rows, git_commit())}", flush=True)
        left = a.minutes - (time.monotonic() - t0) / 60 - 0.5  # half a minute to copy back
        if left > 1.0:
            run_campaign("paper", a.device, left, a.results, store.cache, tables=(
                tuple(a.tables.split(",")) if a.tables else None), data_dir=a.data_dir,
                stream=sys.stdout)
    except FedhetError as e:
        print(f"error: {e}", flush=True)
        return 2
    finally:
        from fedhet.papers.paper_scale import write_page

        page = a.results.parent / "docs" / "paper-scale.md"  # the checkout's, beside its results/
        try:
            page.parent.mkdir(parents=True, exist_ok=True)
            write_page(a.results, page)
            a.out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(page, a.out / "paper-scale.md")
        except FedhetError as e:
            print(f"page not regenerated: {e}", flush=True)
        a.out.mkdir(parents=True, exist_ok=True)
        now_ = _stamps(a.results)
        written = sorted(p for p, stamp in now_.items() if before.get(p) != stamp)
        with tarfile.open(a.out / "results.tar.gz", "w:gz") as tar:
            for path in written:
                tar.add(path, arcname=str(path.relative_to(a.results.parent)))
        gone = sorted(str(p.relative_to(a.results.parent)) for p in before if not p.exists())
        (a.out / "removed.txt").write_text("".join(f"{p}\n" for p in gone))
        print(f"{len(written)} result files packed into {a.out / 'results.tar.gz'} ({records.now()})",
              flush=True)
    return 0


def _stamps(results: Path) -> dict[Path, tuple[int, int]]:
    """Each file under `results` with its size and modification time: what differs at the end
    is what this call wrote."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in results.rglob("*") if p.is_file()}


if __name__ == "__main__":
    sys.exit(main())

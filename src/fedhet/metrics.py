"""Metrics beyond accuracy: registered functions of labels and predictions, or scikit-learn
scorers, and the statistics of a metric over clients.

A run names its metrics in the setting `metrics` (`metrics = ["f1_macro", "my-metric"]`); each
name is, in this order of lookup,

- a metric registered with `fedhet.register_metric("name")` (a plugin's, or a script's): a
  function `fn(y_true, y_pred) -> float` of two NumPy arrays, the labels and the model's
  predicted labels; registered with `scores=True` it gets the model's scores instead of its
  predictions: class probabilities `(n, C)` (the softmax of its outputs), or the raw decision
  value `(n,)` of a one-output model (the squared SVM);
- a scikit-learn scorer name (`sklearn.metrics.get_scorer_names()`: `f1_macro`,
  `balanced_accuracy`, `roc_auc_ovr`, …), scored through the scorer itself on the same
  predictions (`_Scored` stands in for the estimator, so predictions, probabilities and decision
  values are all the model's).

Each is recorded per evaluated round on the evaluation set as `test_<name>`, and with per-client
evaluation on (`client_eval_fraction`) as the four statistics of `client_statistics` over the
clients' held-out shares (`client_<name>_mean`, …). A scikit-learn scorer that is undefined on a
client's share (`roc_auc_ovr` on a share that lacks a class) gives NaN for that client, and the
statistics are taken over the clients where it is defined **[choice]**; a registered metric that
raises stops the run with one line naming it, its error and where it arose (every round saved
before is kept).
"""

from __future__ import annotations

import math
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhet.errors import FedhetError, one_line
from fedhet.registry import Registry, did_you_mean

MetricFn = Callable[[np.ndarray, np.ndarray], float]
"""`fn(y_true, y_pred) -> float` (with the trait `scores=True`: `fn(y_true, scores)`)."""

METRICS: Registry[MetricFn] = Registry("metric")
"""The registered metrics (`fedhet.register_metric`); scikit-learn scorers need no entry."""

WORST_SHARE = 0.1
"""The share of clients `client_statistics` averages for its worst and best columns."""

STATISTICS = ("mean", "std", "worst10", "best10")
"""The statistics over clients, in column order (`client_statistics`)."""


@dataclass(frozen=True)
class Metric:
    """A metric ready to score: its `name` and `score(y_true, y_pred, scores)`."""

    name: str
    score: Callable[[np.ndarray, np.ndarray, np.ndarray], float]
    lenient: bool
    """Whether an error of `score` means "undefined here" (NaN): a scikit-learn scorer's
    `ValueError`; a registered metric's errors propagate."""

    def __call__(self, y_true: np.ndarray, y_pred: np.ndarray, scores: np.ndarray) -> float:
        if not self.lenient:
            try:
                return float(self.score(y_true, y_pred, scores))
            except Exception as e:  # noqa: BLE001  (the user's function: one line, not a traceback)
                raise FedhetError(
                    f"metric {self.name!r} failed: {one_line(e)}{_where(e)}; fix it (it gets the "
                    "labels and the predicted labels, or with scores=True the class "
                    "probabilities, as NumPy arrays) or leave it out of metrics; the rounds "
                    "saved so far are kept"
                ) from e
        with warnings.catch_warnings():  # e.g. UndefinedMetricWarning on a one-label share
            warnings.simplefilter("ignore")
            try:
                return float(self.score(y_true, y_pred, scores))
            except ValueError:
                return math.nan


def _where(error: BaseException) -> str:
    """` (file.py, line N)`: the deepest frame of `error`'s traceback, the user's function."""
    frames = traceback.extract_tb(error.__traceback__)
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def sklearn_scorer_names() -> list[str]:
    """scikit-learn's scorer names (imported on first use: scikit-learn is slow to import)."""
    from sklearn.metrics import get_scorer_names  # slow import (scikit-learn): on first use

    return list(get_scorer_names())


def check_metrics(names: Sequence[str]) -> None:
    """Refuse, in one line, a metric name that is neither registered nor a scikit-learn scorer,
    or a name given twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FedhetError(f"metrics: {name!r} is given twice; name each metric once")
        seen.add(name)
        if name in ("acc", "pacc") or name.startswith(("accuracy", "loss")):
            raise FedhetError(
                f"metrics: {name!r} would overwrite a column fedhet always records (test_accuracy, "
                "test_loss, client_acc_*, client_pacc_*); leave it out, or register yours under "
                "another name"
            )
        if METRICS.canonical(name) in METRICS:
            continue
        scorers = sklearn_scorer_names()
        if name in scorers:
            continue
        hint = did_you_mean(name, [*METRICS.names(), *scorers])
        registered = ", ".join(METRICS.names()) or "none"
        raise FedhetError(
            f"unknown metric {name!r}{hint}; give a metric registered with "
            f"fedhet.register_metric (registered here: {registered}; a plugin's is known once the "
            "plugin is loaded: --plugin FILE.py) or a scikit-learn scorer name such as f1_macro, "
            "balanced_accuracy or roc_auc_ovr (sklearn.metrics.get_scorer_names())"
        )


def resolve(name: str, num_classes: int) -> Metric:
    """The metric `name` (module docstring: a registered one first, else a scikit-learn scorer)
    for a problem with `num_classes` classes."""
    if METRICS.canonical(name) in METRICS:
        entry = METRICS.get(name)
        fn = entry.factory
        if entry.trait("scores", False):
            return Metric(name, lambda y, pred, scores: fn(y, scores), lenient=False)
        return Metric(name, lambda y, pred, scores: fn(y, pred), lenient=False)
    check_metrics([name])
    from sklearn.metrics import get_scorer  # slow import (scikit-learn): only for a scorer

    scorer = get_scorer(name)
    classes = np.arange(num_classes)

    def score(y: np.ndarray, pred: np.ndarray, scores: np.ndarray) -> float:
        rows = np.arange(len(y)).reshape(-1, 1)
        return scorer(_scored(pred, scores, classes), rows, y)

    return Metric(name, score, lenient=True)


def _scored(pred: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> Any:
    """An object a scikit-learn scorer takes for a fitted classifier: asked about the rows
    `X[:, 0]`, it answers with those rows of the model's predictions, class probabilities
    (`scores` of shape `(n, C)`) or decision values (`scores` of shape `(n,)`)."""
    from sklearn.base import BaseEstimator, ClassifierMixin  # slow import (scikit-learn)

    class _Scored(ClassifierMixin, BaseEstimator):
        def __init__(self) -> None:
            self.classes_ = classes

        def fit(self, x: Any, y: Any = None) -> Any:
            return self

        def predict(self, x: np.ndarray) -> np.ndarray:
            return pred[np.asarray(x)[:, 0]]

    if scores.ndim == 2:
        class _Probabilities(_Scored):
            def predict_proba(self, x: np.ndarray) -> np.ndarray:
                return scores[np.asarray(x)[:, 0]]

        return _Probabilities()

    class _Decisions(_Scored):
        def decision_function(self, x: np.ndarray) -> np.ndarray:
            return scores[np.asarray(x)[:, 0]]

    return _Decisions()


def client_statistics(values: Sequence[float] | np.ndarray, prefix: str) -> dict[str, float]:
    """`{prefix}_mean, _std, _worst10, _best10` of one value per client.

    Over the clients whose value is finite (NaN: the metric is undefined there), each client
    counting once: the plain mean, the population standard deviation (ddof 0), and the mean of
    the `k = ⌈0.1·n⌉` lowest and of the `k` highest values **[choice]**: "worst 10 %" is the
    mean of the lowest decile, as fairness studies (q-FFL, Ditto) report it, not the 10th
    percentile; with fewer than 10 clients it is the single worst client. All NaN when no
    client has a finite value."""
    v = np.asarray(values, dtype=np.float64)
    v = np.sort(v[np.isfinite(v)])
    if len(v) == 0:
        return {f"{prefix}_{s}": math.nan for s in STATISTICS}
    k = max(1, math.ceil(WORST_SHARE * len(v) - 1e-9))
    return {
        f"{prefix}_mean": float(v.mean()), f"{prefix}_std": float(v.std()),
        f"{prefix}_worst10": float(v[:k].mean()), f"{prefix}_best10": float(v[-k:].mean()),
    }


def client_columns(metrics: Sequence[str], personalised: bool = False) -> list[str]:
    """The columns per-client evaluation writes: accuracy's statistics, each metric's, then
    (`personalised`) those of the accuracy after fine-tuning (`pacc`)."""
    names = ("acc", *metrics, *(("pacc",) if personalised else ()))
    return [f"client_{m}_{s}" for m in names for s in STATISTICS]


__all__ = [
    "METRICS", "STATISTICS", "Metric", "MetricFn", "check_metrics", "client_columns",
    "client_statistics", "resolve", "sklearn_scorer_names",
]

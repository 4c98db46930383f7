import fedhet
from sklearn.datasets import make_classification

x, y = make_classification(n_samples=20_000, n_features=30, n_informative=20, n_classes=5, random_state=0)
data = fedhet.from_arrays(x, y, name="new-problem")
rows = fedhet.compare(base={"dataset": data, "partition": "dirichlet", "partition.alpha": 0.3, "clients": 20, "rounds": 50},
                      sweeps={"algorithm": ["fedavg", "fednova", "scaffold", "fedveca"]}, out="runs/new-problem-py", jobs=2)
for row in rows:
    print(row["algorithm"], row["final_accuracy"])

python -c "import numpy as np; from sklearn.datasets import make_classification as m; x, y = m(n_samples=20_000, n_features=30, n_informative=20, n_classes=5, random_state=0); np.savez('new-problem.npz', x_train=x, y_train=y)"
fedhet compare -a fedavg,fednova,scaffold,fedveca -d new-problem.npz -p dirichlet --set partition.alpha=0.3 -n 20 -r 50 --jobs 2 --out runs/new-problem-cli

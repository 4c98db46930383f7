"""Image datasets read from their canonical files (MNIST, Fashion-MNIST, CIFAR-10/100).

Placeholder: the loaders are added in a later commit.
"""

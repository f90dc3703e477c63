"""Strategies for training engines that launch Lightning themselves (each needs its extra).

- [`lightning_hetero.integrations.ray`][lightning_hetero.integrations.ray]: Ray Train (``pip install
  'lightning_hetero[ray]'``).

Nothing here is imported by ``import lightning_hetero``.
"""

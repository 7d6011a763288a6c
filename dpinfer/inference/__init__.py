"""Inference for latent true counts behind privatised releases."""

from dpinfer.inference.guard import install as _install_guard
from dpinfer.inference.sample import marginal_model, sample

_install_guard()

__all__ = ["marginal_model", "sample"]

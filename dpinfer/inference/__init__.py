"""Inference for latent true counts behind privatised releases."""

from dpinfer.inference.sample import marginal_model, sample

__all__ = ["marginal_model", "sample"]

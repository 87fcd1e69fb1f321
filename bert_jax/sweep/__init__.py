"""Ablation sweeps: arms of pretraining and fine-tuning runs in one workdir, and their report."""

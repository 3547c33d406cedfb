"""Benchmarks, one folder per question: serving, training, production, scale. Run from the checkout root
with `.venv/bin/python -m bench.<folder>.<script>`; figures and commands in docs/BENCHMARKS.md."""

"""The production loop: replayed logs, warm retrains, what the online figures and the store hold."""

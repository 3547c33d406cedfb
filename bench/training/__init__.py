"""What training costs and what it reaches: steps per second, evaluation cost, sweeps, result tables."""

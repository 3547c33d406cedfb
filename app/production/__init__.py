"""The production loop inside each api worker: what a by-user answer keeps for online evaluation, the
candidates beside the live version (canary, shadow, interleaving, a holdback), the per-version traffic
figures, the loop's ticks that score the kept lists and apply the promotion rule and probation, and
the anytime-valid tests they read."""

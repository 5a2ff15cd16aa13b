"""The CI gate's judging: parse a policy, evaluate its bounds, read saved reports as baselines."""

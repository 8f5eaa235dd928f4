"""The Optuna study over pruned candidates, the Pareto front and the `tune` command line."""

"""The layout search: every layout the strategies allow for a model, a cluster and a global batch,
ranked, with its table and chart."""

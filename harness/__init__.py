"""What runs the strategies: launching, the training loop, measurement, comparison, reports."""

"""The network as clusters are built and NCCL runs on it, and the collectives each layout runs over
it."""
